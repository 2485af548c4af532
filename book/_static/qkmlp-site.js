/* The book's own page script (added by book/_ext/qkmlp_site.py).
 *
 * 1. Wide math scrolls visibly. After MathJax has typeset the page, a formula wider than
 *    its box (display math on a phone, or an inline formula wider than its line) gets
 *    the class `qk-scroll`: its box scrolls sideways (qkmlp-site.css) and fades out on
 *    each side where more of it is hidden (`qk-more-left` / `qk-more-right`). Code
 *    blocks and tables that scroll get the same fades. Re-checked when a box changes
 *    size (the window's width, a dropdown opened).
 *    An inline formula that sits with its punctuation in span.qk-nobr (qkmlp_site.py)
 *    is measured with it, and when it scrolls it leaves the punctuation room on the line.
 * 2. Search: over file:// a browser refuses to fetch the pages, so results show titles
 *    only (no snippet requests, no console errors); over http the snippets show math
 *    typeset by MathJax instead of raw TeX, and are cut from the page's text (not from
 *    its buttons, print-only contents list or code input).
 * 3. Drawers: on a phone, tapping a link in the table of contents or in "On this page"
 *    closes the drawer it is in, so the page shows the section the reader chose.
 * 4. The sidebar does not scroll itself: the theme scrolled it (as the page finished
 *    loading, seconds after it was drawn) whenever the current chapter's entry was in its
 *    lower half, hiding the book's title and the search box, or restored the previous
 *    page's position. It is now placed before it is drawn: at the top, or, when the
 *    current chapter's entry would be out of sight there, just far enough to show it.
 */
(function () {
  "use strict";

  function ready(fn) {
    if (document.readyState !== "loading") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }

  // ------------------------------------------------------------- 1. wide math scrolls
  var SCROLLERS = [
    "mjx-container.MathJax",               // display and inline math (CHTML output)
    ".cell_input pre", ".cell_output pre",  // code and its output
    "div.highlight > pre",
    ".qk-table", ".table-wrapper", ".pst-scrollable-table-container",
  ].join(",");

  function updateFades(el) {
    var more = el.scrollWidth - el.clientWidth;
    el.classList.toggle("qk-more-left", el.scrollLeft > 1);
    el.classList.toggle("qk-more-right", more - el.scrollLeft > 1);
  }

  function isInlineMath(el) {
    return el.tagName === "MJX-CONTAINER" && el.getAttribute("display") !== "true";
  }

  function lineOf(el) {  // the block an inline formula sits in
    var line = el.parentElement;
    while (line && getComputedStyle(line).display.indexOf("inline") === 0) line = line.parentElement;
    return line;
  }

  function check(el) {
    if (isInlineMath(el)) {
      // measure the formula at its natural width first, with the punctuation kept with it
      el.classList.remove("qk-scroll", "qk-more-left", "qk-more-right");
      var math = el.parentElement, nobr = math && math.parentElement;
      if (!(nobr && nobr.classList.contains("qk-nobr"))) nobr = null;
      if (nobr) math.style.maxWidth = "";
      var line = lineOf(el);
      if (!line) return;
      var cs = getComputedStyle(line);
      var room = line.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      var width = el.getBoundingClientRect().width;
      var extra = nobr ? nobr.getBoundingClientRect().width - math.getBoundingClientRect().width : 0;
      if (width === 0 || width + extra <= room + 1) return;
      if (nobr) math.style.maxWidth = Math.max(room - extra - 1, room / 2) + "px";
      el.classList.add("qk-scroll");
    } else if (el.scrollWidth <= el.clientWidth + 1) {
      el.classList.remove("qk-scroll", "qk-more-left", "qk-more-right");
      return;
    } else {
      el.classList.add("qk-scroll");
    }
    if (!el.dataset.qkFades) {
      el.dataset.qkFades = "1";
      el.addEventListener("scroll", function () { updateFades(el); }, { passive: true });
    }
    updateFades(el);
  }

  // Boxes change size when the window does and when a hidden part (a solution in a
  // dropdown) opens: check a box again whenever its size, or the size of the line an
  // inline formula sits in, changes.
  var inlineIn = new WeakMap();  // line -> inline formulas in it
  var observer = window.ResizeObserver && new ResizeObserver(function (entries) {
    entries.forEach(function (e) { (inlineIn.get(e.target) || [e.target]).forEach(check); });
  });

  function observe(el) {
    if (!observer) return;
    var target = isInlineMath(el) ? lineOf(el) : el;
    if (!target) return;
    if (isInlineMath(el)) {
      if (!inlineIn.has(target)) inlineIn.set(target, []);
      inlineIn.get(target).push(el);
    }
    observer.observe(target);
  }

  function markScrollers() {
    document.querySelectorAll(SCROLLERS).forEach(function (el) {
      check(el);
      if (!el.dataset.qkObserved) {
        el.dataset.qkObserved = "1";
        observe(el);
      }
    });
  }

  function afterMathJax(fn) {
    var t0 = Date.now();
    (function wait() {
      if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        MathJax.startup.promise.then(fn, fn);
      } else if (!document.querySelector(".math") || Date.now() - t0 > 30000) {
        fn();
      } else {
        setTimeout(wait, 50);
      }
    })();
  }

  ready(function () {
    afterMathJax(function () {
      markScrollers();
      document.documentElement.dataset.qkScroll = "ready";
      // an inline formula keeps its size when its line narrows: check all on resize
      var width = window.innerWidth, timer = null;
      window.addEventListener("resize", function () {
        if (window.innerWidth === width) return;
        width = window.innerWidth;
        clearTimeout(timer);
        timer = setTimeout(markScrollers, 150);
      });
    });
  });

  // ------------------------------------------------------------- 2. search
  if (typeof DOCUMENTATION_OPTIONS !== "undefined" && location.protocol === "file:") {
    // fetch() of a file:// page is blocked by the browser (CORS): titles only
    DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
  }

  function loadMathJax() {
    if (loadMathJax.promise) return loadMathJax.promise;
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) return MathJax.startup.promise;
    loadMathJax.promise = new Promise(function (resolve, reject) {
      window.MathJax = {
        options: { processHtmlClass: "tex2jax_process|mathjax_process|math|output_area" },
        startup: {
          typeset: false,
          ready: function () { MathJax.startup.defaultReady(); MathJax.startup.promise.then(resolve); },
        },
      };
      var s = document.createElement("script");
      s.src = document.documentElement.dataset.content_root + "_static/mathjax/tex-chtml.js";
      s.onerror = reject;
      document.head.appendChild(s);
    });
    return loadMathJax.promise;
  }

  // Private-use characters stand for a formula while Sphinx cuts the 240-character
  // snippet, so a formula is either whole in it or left out.
  var OPEN = "\uE000", CLOSE = "\uE001";

  function texOf(el) {
    var copy = el.cloneNode(true);
    copy.querySelectorAll(".eqno, .headerlink").forEach(function (x) { x.remove(); });
    var tex = copy.textContent.trim();
    var m = tex.match(/^\\\(([\s\S]*)\\\)$/) || tex.match(/^\\\[([\s\S]*)\\\]$/);
    if (m) tex = m[1];
    // a display environment shown inline in the snippet
    return tex.replace(/\\(begin|end)\{(align|equation|gather)\*?\}/g, function (_, be, env) {
      return env === "equation" ? "" : "\\" + be + "{" + (env === "gather" ? "gathered" : "aligned") + "}";
    }).trim();
  }

  function installSearchMath() {
    if (typeof Search === "undefined" || !Search.makeSearchSummary || Search.qkMath) return;
    Search.qkMath = true;
    var formulas = [];
    var htmlToText = Search.htmlToText, makeSearchSummary = Search.makeSearchSummary;
    Search.htmlToText = function (htmlString, anchor) {
      var doc = new DOMParser().parseFromString(htmlString, "text/html");
      // the page's text only: not its buttons, print-only contents list, sidebars, links on
      doc.querySelectorAll(".bd-header-article, #jb-print-docs-body, .bd-sidebar-secondary, "
          + ".prev-next-area, .bd-footer-article, .cell_input").forEach(function (el) { el.remove(); });
      doc.querySelectorAll("div.math, span.math").forEach(function (el) {
        formulas.push(texOf(el));
        el.replaceWith(doc.createTextNode(" " + OPEN + (formulas.length - 1) + CLOSE + " "));
      });
      return htmlToText(doc.documentElement.outerHTML, anchor);
    };
    Search.makeSearchSummary = function (htmlText, keywords, anchor) {
      var summary = makeSearchSummary(htmlText, keywords, anchor);
      if (!summary) return summary;
      var text = summary.textContent
        .replace(/^(\.\.\.)?[^\uE000]*?\uE001/, function (m, dots) { return m.indexOf(OPEN) < 0 ? (dots || "") : m; })
        .replace(/\uE000\d*(\.\.\.)?$/, function (m, dots) { return dots || ""; });
      summary.textContent = "";
      var parts = text.split(/\uE000(\d+)\uE001/);
      parts.forEach(function (part, i) {
        if (i % 2 === 0) { summary.appendChild(document.createTextNode(part)); return; }
        var tex = formulas[+part];
        if (tex === undefined) return;
        var span = document.createElement("span");
        span.className = "qk-search-math";
        span.dataset.tex = tex;
        summary.appendChild(span);
        loadMathJax().then(function () {
          return MathJax.tex2chtmlPromise(tex, { display: false });
        }).then(function (node) {
          span.appendChild(node);
          MathJax.startup.document.clear();
          MathJax.startup.document.updateDocument();
        }).catch(function () { span.textContent = tex; });
      });
      return summary;
    };
  }

  installSearchMath();
  ready(installSearchMath);

  // ------------------------------------------------------------- 3. drawers close on a tap
  document.addEventListener("click", function (e) {
    var link = e.target.closest && e.target.closest("a[href]");
    var drawer = link && link.closest("dialog#pst-primary-sidebar-modal, dialog#pst-secondary-sidebar-modal");
    // closing moves the links back into the page (the theme's "close" handler); the
    // browser then follows the link as usual
    if (!(drawer && drawer.open)) return;
    drawer.addEventListener("close", function () {
      // the theme gives the focus back to the drawer's button, which shows its tooltip
      // over the header: a tap on a section is not a keyboard user's Escape
      var focused = document.activeElement;
      if (focused && focused.matches && focused.matches(".primary-toggle, .secondary-toggle")) focused.blur();
    }, { once: true });
    drawer.close();
  }, true);

  // ------------------------------------------------------------- 4. the sidebar stays put
  // The theme (pydata-sphinx-theme.js, deferred: it runs as the page finishes loading,
  // seconds after the sidebar is drawn on a long chapter) scrolls the sidebar to put the
  // current entry a quarter down whenever that entry is in the lower half, or restores
  // the previous page's position, both stored under this key. Here the position is
  // chosen as soon as the sidebar is in the page, before it is drawn: the top, or, when
  // the current entry would be out of sight there, just enough to show it. The theme
  // then restores that same position (no jump).
  var KEY = "sidebar-scroll-top";
  function placeSidebar() {
    var sidebar = document.querySelector("div.bd-sidebar-primary");
    var nav = sidebar && sidebar.querySelector(".bd-docs-nav");
    if (!nav) return false;
    var active = nav.querySelectorAll(".active > a, a.current");
    var top = 0;
    if (active.length && sidebar.clientHeight > 0) {
      var link = active[active.length - 1];
      var r = link.getBoundingClientRect(), s = sidebar.getBoundingClientRect();
      var bottom = r.bottom - s.top + sidebar.scrollTop;
      if (bottom > sidebar.clientHeight) top = Math.ceil(bottom - sidebar.clientHeight + r.height);
    }
    sidebar.scrollTop = top;
    try { sessionStorage.setItem(KEY, String(top)); } catch (err) { /* storage blocked */ }
    return true;
  }
  try { sessionStorage.setItem(KEY, "0"); } catch (err) { /* storage blocked */ }
  (function early() {
    // the sidebar's links are complete once what follows them is in the page
    if (document.querySelector(".sidebar-primary-items__end, main#main-content") && placeSidebar()) return;
    if (document.readyState === "loading") requestAnimationFrame(early);
  })();
  ready(placeSidebar);
})();
