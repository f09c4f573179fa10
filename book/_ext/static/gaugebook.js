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

// On a phone a table of prose shows each row as a block of its cells (gaugebook.css), without
// the header row: each cell gets its column's name as data-label, which the style sheet shows
// in front of the cell there. Computed tables in cell outputs keep their columns.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("article.bd-article table").forEach(function (table) {
    if (table.closest("div.cell_output")) {
      return;
    }
    var names = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
      return th.textContent.trim();
    });
    table.querySelectorAll("tbody tr").forEach(function (row) {
      Array.prototype.forEach.call(row.children, function (cell, i) {
        if (names[i]) {
          cell.setAttribute("data-label", names[i]);
        }
      });
    });
  });
});
