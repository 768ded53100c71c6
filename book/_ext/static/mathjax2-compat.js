/* The Jupyter widget manager (html-manager 1.0.6) typesets widget descriptions with MathJax 2's
 * API, `MathJax.Hub.Queue(["Typeset", MathJax.Hub, element])`. The book loads MathJax 3, which
 * has no Hub, so that call throws and can abort a widget's rendering. Give whatever object is
 * `window.MathJax` (the inline configuration first, then MathJax 3 itself) a hidden `Hub`
 * whose Queue forwards to MathJax 3's typesetPromise once MathJax has started. */
(function () {
  "use strict";
  var hub = {
    Queue: function (job) {
      var mj = window.MathJax;
      var el = Array.isArray(job) ? job[2] : undefined;
      if (!mj || typeof mj.typesetPromise !== "function") { return; }
      var ready = (mj.startup && mj.startup.promise) || Promise.resolve();
      ready.then(function () { return mj.typesetPromise(el ? [el] : undefined); })
        .catch(function (err) { console.warn("MathJax typeset of a widget label failed", err); });
    }
  };
  function addHub(obj) {
    if (obj && typeof obj === "object" && !("Hub" in obj)) {
      // Not enumerable, so MathJax 3 does not read it as a configuration option.
      Object.defineProperty(obj, "Hub", { value: hub, enumerable: false, configurable: true, writable: true });
    }
    return obj;
  }
  var current = addHub(window.MathJax);
  try {
    Object.defineProperty(window, "MathJax", {
      configurable: true,
      enumerable: true,
      get: function () { return current; },
      set: function (value) { current = addHub(value); }
    });
  } catch (err) {
    /* window.MathJax not redefinable: leave it; widgets then typeset nothing. */
  }
})();
