"""The notebook layer: what the chapters use on top of the core library.

Nothing in the core (``transformer_lib.*`` outside this package) imports from here.

- ``environment``: ``setup_chapter`` (every chapter's first cell), ``in_book_build``
- ``evidence``: ``glue`` and ``claim``, a run's numbers and checked claims for the prose and the evidence appendix
- ``exercises``: the exercise checkers, one module per chapter (``check_softmax``, ...), and their catalogue
- ``grade``: the classroom grader, ``transformer-grade`` (each notebook in a bubblewrap sandbox, results read
  from the kernel's execute replies)
- ``runs``: ``fit_together`` (independent runs side by side on a CPU's cores), ``map_in_processes`` and
  ``search_seeds`` (seeds trained in turn until a run passes a test, and how often they do)
- ``widgets``: ``explore``, one control and an immediate picture, also in the HTML book
- ``viz``: bertviz ``head_view``/``model_view`` that render offline in the book
- ``plots``: ``plot_attention_grid``, ``plot_history``, ``LivePlot`` (a ``Trainer`` callback)
- ``reference_gpt``: a nanoGPT-shaped GPT and nanoGPT's training step for it (chapter 8)
- ``race``: the library's step raced against the reference's, step by step on the same batches (chapter 8)
- ``benchmark``: the machine's multiply rate and bandwidth, a step's FLOPs and operator times (chapters 8 and 9)
"""
