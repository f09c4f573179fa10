// A figure opens at full size when clicked or tapped: a phone shrinks a wide figure to the
// column, where its labels are too small to read. (Explorer frames are inline data: images,
// not files under _images/, and stay as they are.)
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll('article.bd-article img[src*="_images/"]').forEach(function (img) {
    if (img.closest("a")) {
      return;
    }
    var link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "gb-full-size";
    link.title = "Open the figure at full size";
    img.parentNode.insertBefore(link, img);
    link.appendChild(img);
  });
});

// MathJax 4 breaks a display equation wider than its column into lines when it typesets the
// page (_config.yml: output.displayOverflow). When the column's width changes (a phone turned,
// a window resized), break them again for the new width.
(function () {
  var width = window.innerWidth, timer = null;
  window.addEventListener("resize", function () {
    clearTimeout(timer);
    timer = setTimeout(function () {
      var mj = window.MathJax;
      if (window.innerWidth === width || !(mj && mj.startup && mj.startup.promise && mj._)) {
        return;
      }
      width = window.innerWidth;
      mj.startup.promise.then(function () {
        return mj.startup.document.rerenderPromise(mj._.core.MathItem.STATE.METRICS);
      });
    }, 300);
  });
})();
