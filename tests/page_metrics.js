// What a reader of one page of the built book meets, measured in the browser (evaluated by
// tests/measure_pages.py and tests/test_browser.py with page.evaluate, on a page as it
// loads: dropdowns and folded cells as the reader finds them, closed).
//
// Returns:
//   height        the article's height (CSS px) and the whole page's
//   code          visible code: code-cell inputs and code blocks of the text that are drawn
//                 (a folded cell, hide-input, draws only its "Show code" line, which is not
//                 counted), their heights in px and as a share of the article's height
//   tables        every table of the article: its columns, whether it scrolls sideways
//                 (wider than the box it scrolls in, or than the text column), which
//                 header cells are not wholly in view before scrolling, and whether it has
//                 a verdict column (a header cell matching `verdict`, default /verdict/i)
//   broken        inline code broken across lines between two letters or digits (a break
//                 after . _ / - or a space is allowed): each as text with "|" at the break
//   header        the header's buttons and links a reader can tap: name and size in px
//   stranded      punctuation written against an inline formula ("$x$," or "($x$") that
//                 the line break parted from it: a comma starting a line, a bracket ending one
//   math_scrolling inline formulas that scroll sideways (wider than their line)
//   sliders       every drawn slider (input[type=range]) of the article, a touch target:
//                 name (its id, else its explorer's id) and size in px
({verdict = "verdict"} = {}) => {
  const verdictRe = new RegExp(verdict, "i");
  const article = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
  const short = (s, n = 60) => { s = (s || "").replace(/\s+/g, " ").trim(); return s.length > n ? s.slice(0, n) + "…" : s; };
  const section = el => {
    const s = el.closest("section");
    const h = s && s.querySelector("h1, h2, h3, h4");
    return h ? short(h.textContent.replace(/#$/, ""), 40) : "";
  };
  // Inside a closed <details> (a hide-input cell, a dropdown) an element is laid out, with a
  // height, but not drawn (Chromium 131+ hides the content with content-visibility): only
  // the summary line shows.
  const folded = el => {
    const d = el.closest("details:not([open])");
    return !!d && !(el.closest("summary") && d.contains(el.closest("summary")));
  };
  const drawn = el => {
    if (folded(el)) return false;
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.height > 0 && r.width > 0 && s.visibility !== "hidden" && s.display !== "none";
  };
  const scrollsX = el => { const o = getComputedStyle(el).overflowX; return o === "auto" || o === "scroll"; };
  const out = {
    height: {article: Math.round(article.getBoundingClientRect().height),
             page: document.documentElement.scrollHeight},
    code: {cells_px: 0, text_px: 0, px: 0, share: 0, cells_shown: 0, cells_folded: 0, blocks_shown: 0, largest: []},
    tables: [], broken: [], header: [], stranded: [], math_scrolling: 0, sliders: [],
  };

  // ------------------------------------------------------------------ visible code
  const sizes = [];
  for (const cell of article.querySelectorAll(".cell_input")) {
    if (drawn(cell)) {
      const h = cell.getBoundingClientRect().height;
      out.code.cells_px += h;
      out.code.cells_shown++;
      sizes.push([h, "cell: " + short(cell.textContent, 50) + (section(cell) ? ` [in "${section(cell)}"]` : "")]);
    } else {
      out.code.cells_folded++;
    }
  }
  // code blocks of the text (```bash and the like): not inside a cell
  for (const block of article.querySelectorAll("div[class*='highlight-'] > div.highlight, div.literal-block-wrapper")) {
    if (block.closest(".cell_input, .cell_output, .cell")) continue;
    if (!drawn(block)) continue;
    out.code.text_px += block.getBoundingClientRect().height;
    out.code.blocks_shown++;
  }
  out.code.px = Math.round(out.code.cells_px + out.code.text_px);
  out.code.cells_px = Math.round(out.code.cells_px);
  out.code.text_px = Math.round(out.code.text_px);
  out.code.share = out.height.article ? out.code.px / out.height.article : 0;
  out.code.largest = sizes.sort((a, b) => b[0] - a[0]).slice(0, 5).map(([h, w]) => `${Math.round(h)} px ${w}`);

  // ------------------------------------------------------------------ tables
  const column = article.getBoundingClientRect();
  for (const table of article.querySelectorAll("table")) {
    if (table.closest("mjx-container, .highlighttable, .cell_input") || table.classList.contains("highlighttable")) continue;
    if (folded(table)) continue;      // a table in a closed dropdown is met only when opened
    const headRow = table.querySelector("thead tr") || table.querySelector("tr");
    if (!headRow) continue;
    const heads = [...headRow.children].filter(c => c.tagName === "TH" || c.tagName === "TD");
    let box = table.parentElement;
    while (box && box !== article && !scrollsX(box)) box = box.parentElement;
    if (box === article) box = null;
    const tr = table.getBoundingClientRect();
    let scrolls, right;
    if (box) {
      scrolls = box.scrollWidth > box.clientWidth + 1;
      const br = box.getBoundingClientRect();
      right = br.left + box.clientLeft + box.clientWidth;
    } else {
      scrolls = tr.width > column.width + 1;
      right = column.right;
    }
    const names = heads.map(h => short(h.textContent, 30));
    // a header row hidden for the eye (a table shown as cards keeps it for screen
    // readers, 1 px wide): whether a column is in view is read off its first data row
    const hr = (headRow.parentElement.tagName === "THEAD" ? headRow.parentElement : headRow).getBoundingClientRect();
    const firstRow = hr.width <= 1 || hr.height <= 1 ? table.querySelector("tbody tr") : headRow;
    const cells = firstRow ? [...firstRow.children] : [];
    const hidden = cells.map((c, i) => [c, names[i] || ""])
      .filter(([c]) => drawn(c) && c.getBoundingClientRect().right > right + 1).map(([, n]) => n);
    const verdictCols = names.filter(n => verdictRe.test(n));
    const caption = table.querySelector("caption") || (table.closest("figure") || {}).querySelector?.("figcaption");
    out.tables.push({
      where: short(caption ? caption.textContent : names.join(" | "), 70) + (section(table) ? ` [in "${section(table)}"]` : ""),
      columns: heads.length, names, scrolls, hidden, verdict: verdictCols.length > 0,
      verdict_hidden: hidden.some(n => verdictRe.test(n)),
      width: Math.round(tr.width), box: Math.round(box ? box.clientWidth : column.width),
      stacked: getComputedStyle(table).display === "block" && !scrolls,
    });
  }

  // ------------------------------------------------------------------ identifiers broken mid-word
  const nameChar = /[A-Za-z0-9]/;
  for (const code of article.querySelectorAll("code, kbd, samp")) {
    if (code.closest("pre, mjx-container")) continue;
    if (code.getClientRects().length < 2) continue;   // on one line
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const chars = [];   // [char, top] for every drawn character, in order
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.data.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rects = range.getClientRects();
        if (!rects.length) continue;
        chars.push([node.data[i], rects[0].top, rects[0].height]);
      }
    }
    let text = "", bad = false;
    for (let i = 0; i < chars.length; i++) {
      if (i > 0 && chars[i][1] > chars[i - 1][1] + chars[i - 1][2] / 2) {
        const breaksWord = nameChar.test(chars[i - 1][0]) && nameChar.test(chars[i][0]);
        if (breaksWord) bad = true;
        text += breaksWord ? "|" : "¦";
      }
      text += chars[i][0];
    }
    if (bad) out.broken.push({text: short(text, 80), table: !!code.closest("table"),
                              where: section(code)});
  }

  // ------------------------------------------------------------------ punctuation parted from math
  const charRect = (node, i) => {
    const range = document.createRange();
    range.setStart(node, i);
    range.setEnd(node, i + 1);
    return range.getBoundingClientRect();
  };
  for (const c of article.querySelectorAll("mjx-container")) {
    if (c.getAttribute("display") === "true" || !drawn(c)) continue;
    if (c.classList.contains("qk-scroll")) out.math_scrolling++;
    const math = c.closest("span.math") || c;
    const rects = math.getClientRects();
    if (!rects.length) continue;
    const first = rects[0], last = rects[rects.length - 1];
    const tex = short(c.getAttribute("aria-label") || (math.textContent || ""), 40);
    const next = math.nextSibling, prev = math.previousSibling;
    if (next && next.nodeType === 3 && /^[.,;:!?)\]\u201d\u2019]/.test(next.data)) {
      const r = charRect(next, 0);
      if (r.height && r.top >= last.bottom - 2)
        out.stranded.push({text: `${tex}|${next.data.slice(0, 12)}`, where: section(c)});
    }
    if (prev && prev.nodeType === 3 && /[(\[\u201c\u2018]$/.test(prev.data)) {
      const r = charRect(prev, prev.data.length - 1);
      if (r.height && first.top >= r.bottom - 2)
        out.stranded.push({text: `${prev.data.slice(-12)}|${tex}`, where: section(c)});
    }
  }

  // ------------------------------------------------------------------ sliders
  for (const el of article.querySelectorAll("input[type=range]")) {
    if (!drawn(el)) continue;
    const r = el.getBoundingClientRect();
    const owner = el.id ? el : el.closest("[id]");
    const name = "#" + (owner ? owner.id : "?") + (el.id ? "" : " " + (el.className || "range"));
    out.sliders.push({name, width: Math.round(r.width * 10) / 10, height: Math.round(r.height * 10) / 10});
  }

  // ------------------------------------------------------------------ header tap targets
  const W = document.documentElement.clientWidth;
  for (const el of document.querySelectorAll(".bd-header-article button, .bd-header-article a[href], .bd-header-article .btn")) {
    if (el.closest(".dropdown-menu")) continue;
    if (!drawn(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.right <= 0 || r.left >= W) continue;
    const name = el.getAttribute("aria-label") || el.getAttribute("title") || el.getAttribute("data-bs-title")
      || short(el.textContent, 20) || el.className;
    out.header.push({name, width: Math.round(r.width * 10) / 10, height: Math.round(r.height * 10) / 10});
  }
  return out;
}
