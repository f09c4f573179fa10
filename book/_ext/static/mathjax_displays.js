// Display equations wider than a phone's column. This sets MathJax 4's overflow of each
// display without a table to "linebreak" and says where it may break, only where a reader
// would, at the formula's top level:
// - at a wide space between two formulas (\quad, \qquad);
// - after a comma followed by a space (a list; a tuple's too, inside parentheses);
// - at a relation or binary operator (a bad break where the display has wide spaces; MathJax
//   may still take it first, so a list of formulas is better written as an aligned block).
// Never inside a group, a fence, parentheses (\big ones too, which MathJax keeps beside what
// they enclose) or a product: alone, MathJax broke "(a + b)M" after the parenthesis,
// "24\,\epsilon" at the thin space and chapter 2's "(XW_V + b_V)" at the plus. A display
// holding a table (aligned blocks, matrices) keeps MathJax's default (MathJax broke the cells
// of chapter 8's aligned block into overlapping lines): like a display with no allowed break
// that fits, it scrolls in its box. This file runs after the page's MathJax configuration,
// which it extends, and before MathJax loads; a page without math has neither.
if (window.MathJax) {
  window.MathJax.startup = Object.assign(window.MathJax.startup || {}, {
    ready: function () {
      MathJax.startup.defaultReady();
      // MathJax keeps the width it breaks lines at from one equation to the next and lays out
      // a table against it: forget it before each equation (set again for those that break)
      MathJax.startup.output.preFilters.add(function () {
        MathJax.startup.output.containerWidth = undefined;
      });
      var BIN = 2, REL = 3, PUNCT = 6;  // MathJax's TeX classes
      var OPENING = ["(", "[", "{", "\u27e8"], CLOSING = [")", "]", "}", "\u27e9"];
      var nesting = function (node) {  // +1 where parentheses open ("(", "\\big["), -1: close
        var text = node.isEmbellished ? node.coreMO().getText() : null;
        return OPENING.indexOf(text) >= 0 ? 1 : CLOSING.indexOf(text) >= 0 ? -1 : 0;
      };
      var wide = function (node) {
        var match = /^([\d.]+)em$/.exec(node.attributes.get("width") || "");
        return node.isKind("mspace") && match !== null && parseFloat(match[1]) >= 1;
      };
      var space = function (node) {  // \, \; \quad (mspace) or "\ " (a blank mtext)
        return node.isKind("mspace") || (node.isKind("mtext") && !node.getText().trim());
      };
      var breaks = function (top) {  // top-level node -> its linebreak value
        var out = new Map(), hasWide = top.childNodes.some(wide), depth = 0;
        top.childNodes.forEach(function (node, i) {
          var after = top.childNodes[i + 1], change = nesting(node);
          depth += change;
          if (node.isKind("mo") && node.texClass === PUNCT && after && space(after)) {
            out.set(node, "auto");  // a comma of a list (a tuple's too): MathJax breaks after it
          } else if (depth > 0 || change < 0) {  // inside parentheses, or closing them
            return;
          } else if (wide(node)) {
            out.set(node, "goodbreak");
          } else if (node.isKind("mo") && (node.texClass === REL || node.texClass === BIN)) {
            out.set(node, hasWide ? "badbreak" : "auto");
          }
        });
        return out;
      };
      MathJax.startup.input[0].postFilters.add(function (args) {
        var root = args.data.root, table = false, allowed;
        if (!args.math.display) {
          return;
        }
        root.walkTree(function (node) {
          table = table || node.isKind("mtable");
        });
        if (table) {  // MathJax's default overflow: it stays as wide as it is, the theme scrolls it
          return;
        }
        root.attributes.set("overflow", "linebreak");
        allowed = breaks(root.childNodes[0]);
        root.walkTree(function (node) {
          if ((node.isKind("mspace") || node.isKind("mo")) && !node.attributes.isSet("linebreak")) {
            node.attributes.set("linebreak", allowed.get(node) || "nobreak");
          }
        });
      });
    }
  });
}
