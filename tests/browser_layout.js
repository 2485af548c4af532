// How a page of the built book looks to a reader, measured in the browser; evaluated by
// tests/test_browser.py (page.evaluate) at 1280 px and at 390 px. Returns, per check, a
// list of problems in words (empty: the check passed) plus a few measurements.
//
// Checks:
//   raw_table     a Markdown table left as text ("| --- |" or "|—|—|" outside code input)
//   wide_math     a formula wider than its column at the desktop width
//   cut_math      a formula cut off with no way to scroll to the rest, or scrolling with
//                 no visible sign (no fade from qkmlp-site.css)
//   page_width    the page (or an element of it) wider than the window
//   figure_resolution  a raster image drawn below 1.5x its displayed size; an SVG image
//                 shown below 0.95 of its natural size
//   figure_text   text in a figure below 9 pt at the displayed size: matplotlib SVGs
//                 (text drawn as glyph paths: size = 100 glyph units per em x the glyph's
//                 scale on screen; a text's size is its largest glyph, so sub- and
//                 superscripts count at their base size) and <text> in SVGs
//   explorer      a static explorer wider than the window or cut inside its box
//   icons         a theme icon drawn without its icon font
async ({phone, minPt, rasterScale, svgScale}) => {
  // open every dropdown (solutions, details), as a reader may: what is inside must fit too
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  const W = document.documentElement.clientWidth;
  const out = {raw_table: [], wide_math: [], cut_math: [], page_width: [],
               figure_resolution: [], figure_text: [], explorer: [], icons: [],
               stats: {figures: 0, svgTextMeasured: 0, minFigurePt: null, math: 0, figureText: []}};
  const t0 = Date.now();
  // wait for MathJax and for the site script's pass over wide boxes
  while (document.querySelector('.math') && !(window.MathJax && MathJax.startup && MathJax.startup.promise)
         && Date.now() - t0 < 20000) await new Promise(r => setTimeout(r, 50));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  if (document.querySelector('script[src*="qkmlp-site.js"]'))
    while (!document.documentElement.dataset.qkScroll && Date.now() - t0 < 20000)
      await new Promise(r => setTimeout(r, 50));
  await document.fonts.ready;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));

  const main = document.querySelector('main') || document.body;
  const short = (s, n = 70) => { s = (s || '').replace(/\s+/g, ' ').trim(); return s.length > n ? s.slice(0, n) + '…' : s; };
  const describe = el => {
    const id = el.id ? '#' + el.id : '';
    const cls = (el.getAttribute('class') || '').trim().split(/\s+/).filter(Boolean).slice(0, 2).map(c => '.' + c).join('');
    return el.tagName.toLowerCase() + id + cls;
  };
  const section = el => {  // the nearest heading before el, to say where on the page it is
    const s = el.closest('section');
    const h = s && s.querySelector('h1, h2, h3, h4');
    return h ? ' [in "' + short(h.textContent.replace(/#$/, ''), 40) + '"]' : '';
  };
  const visible = el => {
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none';
  };
  const scrollsX = el => { const o = getComputedStyle(el).overflowX; return o === 'auto' || o === 'scroll'; };
  const clipsX = el => getComputedStyle(el).overflowX !== 'visible';
  const hasFade = el => {
    const s = getComputedStyle(el);
    return (s.maskImage && s.maskImage !== 'none') || (s.webkitMaskImage && s.webkitMaskImage !== 'none');
  };

  // ---------------------------------------------------------------- raw Markdown tables
  // a header separator row of two or more columns: | --- | --- |, or |—|—| once smart
  // quotes made dashes of it; searched in text blocks, not in code input
  const cell = '\\s*:?(?:-{3,}|[\u2013\u2014]+-*):?\\s*';
  const separator = new RegExp(`[^\\n]{0,40}\\|${cell}(\\|${cell})+\\|[^\\n]{0,40}`);
  const isInput = el => el.closest('.cell_input') ||
    (el.closest('div[class*="highlight-"]') && !el.closest('.cell_output'));
  const blocks = [...main.querySelectorAll('p, pre, li, td, dd')].filter(el => !isInput(el));
  for (const el of blocks) {
    const m = el.textContent.match(separator);
    if (!m || blocks.some(inner => inner !== el && el.contains(inner) && separator.test(inner.textContent))) continue;
    out.raw_table.push(`Markdown table shown as text: "${short(m[0], 60)}"${section(el)}`);
  }

  // ---------------------------------------------------------------- math
  const texOf = new Map();
  if (window.MathJax && MathJax.startup && MathJax.startup.document)
    for (const item of MathJax.startup.document.math) texOf.set(item.typesetRoot, item.math);
  for (const c of main.querySelectorAll('mjx-container')) {
    if (!visible(c) && !c.closest('details:not([open]), .toggle-hidden, .dropdown:not([open])')) continue;
    out.stats.math++;
    const display = c.getAttribute('display') === 'true';
    const mathEl = c.querySelector(':scope > mjx-math') || c;
    const w = mathEl.getBoundingClientRect().width;
    if (w === 0) continue;  // inside a closed dropdown: no layout to measure
    const div = c.closest('div.math');
    const eqno = div && div.querySelector('.eqno');
    const label = (eqno ? eqno.textContent.replace('#', '').trim() + ' ' : '') +
                  '"' + short(texOf.get(c) || c.textContent, 60) + '"' + section(c);
    // the room the formula has: a display formula's box, or an inline formula's line
    let room;
    if (display) {
      room = c.clientWidth;
    } else {
      let line = c.parentElement;
      while (line && getComputedStyle(line).display.startsWith('inline')) line = line.parentElement;
      const s = getComputedStyle(line);
      room = line.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
    }
    if (w <= room + 1) continue;
    const kind = display ? 'display equation' : 'inline formula';
    if (!phone)
      out.wide_math.push(`${kind} ${label} is ${Math.round(w)} px wide, its column ${Math.round(room)} px`);
    // wider than its room: it must sit in a box that scrolls to it, with a visible sign
    let box = c, scroller = null;
    while (box && box !== document.body) {
      if (clipsX(box) && (box.getBoundingClientRect().width < w - 1 || box === c)) {
        if (scrollsX(box) && box.scrollWidth > box.clientWidth + 1) scroller = box;
        break;
      }
      box = box.parentElement;
    }
    if (!scroller && box && box !== document.body && clipsX(box))
      out.cut_math.push(`${kind} ${label} (${Math.round(w)} px) is cut to ${Math.round(box.clientWidth)} px by ${describe(box)}, with no scrolling`);
    else if (scroller && !hasFade(scroller))
      out.cut_math.push(`${kind} ${label} (${Math.round(w)} px) scrolls in ${Math.round(scroller.clientWidth)} px with no visible sign that it does`);
  }

  // ---------------------------------------------------------------- page width
  const pageWidth = Math.max(document.documentElement.scrollWidth, document.body.scrollWidth);
  if (pageWidth > W + 1) {
    const culprits = [];
    for (const el of document.body.querySelectorAll('*')) {
      if (culprits.length >= 6) break;
      const r = el.getBoundingClientRect();
      if (r.right <= W + 1 || r.width === 0 || !visible(el)) continue;
      // outermost: its parent fits, and no ancestor clips it
      const p = el.parentElement;
      if (p && p.getBoundingClientRect().right > W + 1) continue;
      let a = p, clipped = false;
      while (a && a !== document.body) { if (clipsX(a)) { clipped = true; break; } a = a.parentElement; }
      if (!clipped) culprits.push(`${describe(el)} reaches ${Math.round(r.right)} px "${short(el.textContent, 50)}"${section(el)}`);
    }
    out.page_width.push(`page is ${pageWidth} px wide in a ${W} px window: ` + (culprits.join('; ') || 'no single element found'));
  }

  // ---------------------------------------------------------------- figures
  const decode = src => {
    const comma = src.indexOf(','), head = src.slice(0, comma), data = src.slice(comma + 1);
    if (head.includes(';base64')) return new TextDecoder().decode(Uint8Array.from(atob(data), ch => ch.charCodeAt(0)));
    return decodeURIComponent(data);
  };
  const svgTexts = (svg) => {  // [{label, px}] of an SVG element that is in the document
    const found = [];
    const scale = el => { const m = el.getCTM(); return m ? Math.sqrt(Math.abs(m.a * m.d - m.b * m.c)) : 0; };
    const fromMatplotlib = svg.querySelectorAll('g[id^="text_"]');
    for (const g of fromMatplotlib) {
      let px = 0;
      for (const u of g.querySelectorAll('use')) px = Math.max(px, 100 * scale(u));
      const comment = [...g.childNodes].find(n => n.nodeType === Node.COMMENT_NODE);
      if (px > 0) found.push({label: comment ? comment.textContent.trim() : g.id, px});
    }
    for (const t of svg.querySelectorAll('text')) {
      if (!t.textContent.trim()) continue;
      const px = parseFloat(getComputedStyle(t).fontSize) * scale(t);
      if (px > 0) found.push({label: t.textContent.trim(), px});
    }
    return found;
  };
  const report = (where, texts) => {
    if (!texts.length) return;
    out.stats.svgTextMeasured++;
    const pts = texts.map(t => ({label: t.label, pt: t.px * 0.75})).sort((a, b) => a.pt - b.pt);
    const least = pts[0].pt;
    out.stats.figureText.push({where, minPt: least});
    out.stats.minFigurePt = out.stats.minFigurePt === null ? least : Math.min(out.stats.minFigurePt, least);
    const small = pts.filter(t => t.pt < minPt - 1e-6);
    if (small.length)
      out.figure_text.push(`${where}: ${small.length} text(s) below ${minPt} pt, smallest ` +
        small.slice(0, 3).map(t => `"${short(t.label, 20)}" ${t.pt.toFixed(1)} pt`).join(', '));
  };
  let n = 0;
  for (const img of main.querySelectorAll('img')) {
    // (img.toggler: the module index's expand/collapse sign, not a figure)
    if (!visible(img) || !img.naturalWidth || img.classList.contains('toggler')) continue;
    n++;
    out.stats.figures++;
    const r = img.getBoundingClientRect();
    const src = img.currentSrc || img.src;
    const isSvg = src.startsWith('data:image/svg+xml') || /\.svg(\?|#|$)/i.test(new URL(src, location.href).pathname);
    const where = `image ${n} ${describe(img)} ${img.alt ? '"' + short(img.alt, 30) + '"' : ''}${section(img)}`.replace(/\s+/g, ' ');
    if (isSvg) {
      const f = r.width / img.naturalWidth;
      if (f < svgScale - 1e-3)
        out.figure_resolution.push(`${where}: SVG shown at ${Math.round(r.width)} px, ${(100 * f).toFixed(0)} % of its natural ${img.naturalWidth} px (needs ≥ ${100 * svgScale} %)`);
      let source = null;
      try { source = src.startsWith('data:') ? decode(src) : await (await fetch(src)).text(); } catch (e) {}
      if (!source) continue;
      const doc = new DOMParser().parseFromString(source, 'image/svg+xml');
      const svg = doc.documentElement;
      if (svg.tagName.toLowerCase() !== 'svg') continue;
      // draw the SVG off screen at the displayed size and measure its text there
      const copy = document.importNode(svg, true);
      if (!copy.getAttribute('viewBox')) {
        copy.setAttribute('viewBox', `0 0 ${img.naturalWidth} ${img.naturalHeight}`);
      }
      copy.setAttribute('width', r.width);
      copy.setAttribute('height', r.height);
      copy.setAttribute('preserveAspectRatio', 'none');
      const holder = document.createElement('div');
      holder.style.cssText = 'position:absolute;left:-20000px;top:0;width:' + r.width + 'px';
      holder.appendChild(copy);
      document.body.appendChild(holder);
      try { report(where, svgTexts(copy)); } finally { holder.remove(); }
    } else {
      const fx = img.naturalWidth / r.width, fy = img.naturalHeight / r.height;
      const f = Math.min(fx, fy);
      if (f < rasterScale - 1e-3)
        out.figure_resolution.push(`${where}: ${img.naturalWidth}×${img.naturalHeight} raster shown at ${Math.round(r.width)}×${Math.round(r.height)} px, ${(Math.floor(f * 100) / 100).toFixed(2)}× (needs ≥ ${rasterScale}×)`);
    }
  }
  // SVG drawn inline in the page (e.g. an explorer's plot)
  let k = 0;
  for (const svg of main.querySelectorAll('svg')) {
    if (!visible(svg) || svg.closest('mjx-container, button, .headerlink, .copybtn') || svg.parentElement.closest('svg')) continue;
    k++;
    report(`inline svg ${k} ${describe(svg)}${section(svg)}`, svgTexts(svg));
  }

  // ---------------------------------------------------------------- explorers
  for (const ex of document.querySelectorAll('div.qkmlp-static-explorer')) {
    if (!visible(ex)) continue;
    const r = ex.getBoundingClientRect();
    const name = describe(ex) + section(ex);
    if (r.right > W + 1 || r.left < -1)
      out.explorer.push(`${name} spans ${Math.round(r.left)}–${Math.round(r.right)} px in a ${W} px window`);
    if (ex.scrollWidth > ex.clientWidth + 1)
      out.explorer.push(`${name}: content ${ex.scrollWidth} px wide in a ${ex.clientWidth} px box`);
    for (const part of ex.querySelectorAll('svg, table, .qkmlp-controls')) {
      const pr = part.getBoundingClientRect();
      if (visible(part) && (pr.right > Math.min(r.right, W) + 1))
        out.explorer.push(`${name}: ${describe(part)} reaches ${Math.round(pr.right)} px, past the ${r.right > W ? 'window' : 'explorer'} (${Math.round(Math.min(r.right, W))} px)`);
    }
  }

  // ---------------------------------------------------------------- icons
  const iconFont = [...document.fonts].filter(f => /Font Awesome/.test(f.family));
  for (const button of document.querySelectorAll('.bd-header-article button, .bd-header-article a.btn, .prev-next-area a')) {
    if (!visible(button)) continue;
    for (const i of button.querySelectorAll('[class*="fa-"]')) {
      if (getComputedStyle(i).display === 'none') continue;  // e.g. the theme switch's other modes
      const before = getComputedStyle(i, '::before').content;
      if (!before || before === 'none' || before === 'normal' || i.getBoundingClientRect().width < 1)
        out.icons.push(`${describe(i)} in ${describe(button)} has no glyph`);
      else if (!iconFont.some(f => f.status === 'loaded'))
        out.icons.push(`${describe(i)}: the icon font did not load`);
    }
  }
  out.icons = [...new Set(out.icons)];
  return out;
}
