/* The widget manager (html-manager 1.0.6) loads its icon fonts from the folder of a module of its own, as
 * require.js names it: by default <page folder>/@jupyter-widgets/ or .../@jupyter-widgets/html-manager/dist/,
 * which do not exist. Loaded before require.js, this is require.js's configuration: both modules live in the
 * book's vendored copy, _static/npm/html-manager/embed-amd.js (scripts/vendor_js.py), next to the fonts. */
var require = (function () {
  var folder = new URL("npm/html-manager", document.currentScript.src).href;
  return {
    paths: {
      "@jupyter-widgets/html-manager": folder + "/embed-amd",
      "@jupyter-widgets/html-manager/dist": folder
    }
  };
})();
