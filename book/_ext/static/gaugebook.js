// A figure opens at full size when clicked or tapped: a phone shrinks a wide figure to the
// column, where its labels are too small to read. A figure with slide files already links to
// its 300-dpi PNG (figure_files.py); any other image gets a link to itself. (Explorer frames
// are inline data: images, not files under _images/, and stay as they are.)
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
