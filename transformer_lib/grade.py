"""``python -m transformer_lib.grade SUBMISSION.ipynb [...] [--csv OUT.csv] [--chapter N] [-j N]``: grade a class.

The command line only. The grader itself is in the notebook layer, :mod:`transformer_lib.notebook.grade`;
this module is the one entry point of ``transformer_lib/*.py`` allowed to reach into that layer
(``tests/test_layers_imports.py`` names it), so that the command is as short as the issue and the book
say. Nothing imports it: ``import transformer_lib`` stays free of the notebook layer.
"""

import sys

from transformer_lib.notebook.grade import main

if __name__ == "__main__":
    sys.exit(main())
