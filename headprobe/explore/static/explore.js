// headprobe explore: the page. No framework, no network beyond this server (or the data embedded by
// `headprobe explore --export`). The map of one head is drawn from tiles of exact pooled attention
// mass (headprobe/explore/pooling.py): a pixel of level n is the mean over 2^n query rows of the mass
// they put on 2^n keys. window.hp is the page's small test/automation interface.
"use strict";

const hp = (() => {
  const STATIC = window.HEADPROBE_STATIC || null;
  const STATIC_STATUS = "static page: what it holds is said under Heads";
  let MAP_SIZE = 512;            // canvas side in CSS pixels (smaller when two maps are compared)
  const LABEL_PPT = 40;          // pixels per token from which cells show probabilities and tokens
  const MAX_PPT = 64;            // deepest zoom: 64 pixels per token
  const state = {
    info: null, metric: "entropy", scale: "log",
    view: { u0: 0, v0: 0, zoom: 1 },  // linked across maps, in fractions of each input's length
    heads: [], maps: [], focus: null, row: null, pending: 0, labels: [], cmap: null,
  };
  const tiles = new Map();     // key -> {values: Float32Array, meta, image, imageKey}
  const tokenCache = new Map(); // model -> Map(chunk -> [texts])
  const TOKEN_CHUNK = 1024;

  // ---- data --------------------------------------------------------------------------------------
  function apiKey(route, params) {
    const query = Object.keys(params).sort().map((k) => `${k}=${encodeURIComponent(params[k])}`).join("&");
    return route + (query ? "?" + query : "");
  }

  async function api(route, params = {}) {
    const key = apiKey(route, params);
    if (STATIC) {
      if (key in STATIC.answers) return STATIC.answers[key];
      throw new Error(`not in this export (${key}); run headprobe explore for every zoom level`);
    }
    state.pending += 1;
    try {
      const response = await fetch(`api/${key}`);
      const body = await response.json();
      if (!response.ok) throw new Error(body.detail || response.statusText);
      return body;
    } finally {
      state.pending -= 1;
    }
  }

  function status(message) {
    document.getElementById("status").textContent = message || "";
  }

  function colour(t) {
    const a = state.cmap.anchors;
    t = Math.min(1, Math.max(0, t));
    for (let i = 1; i < a.length; i++) {
      if (t <= a[i][0]) {
        const f = (t - a[i - 1][0]) / (a[i][0] - a[i - 1][0]);
        return a[i][1].map((c, n) => Math.round(a[i - 1][1][n] + f * (c - a[i - 1][1][n])));
      }
    }
    return a[a.length - 1][1];
  }

  function shade(value, vmax) {
    // position on the colour map: linear in value / vmax, or log over cmap.log_decades decades below vmax
    if (!(vmax > 0)) return 0;
    if (state.scale === "log") {
      const d = state.cmap.log_decades;
      return value > 0 ? (Math.log10(value / vmax) + d) / d : 0;
    }
    return value / vmax;
  }

  // ---- the head overview -------------------------------------------------------------------------
  async function drawOverviews() {
    const box = document.getElementById("overviews");
    box.innerHTML = "";
    for (const [m, model] of state.info.models.entries()) {
      let values;
      try {
        values = (await api("overview", { model: m, metric: state.metric })).values;
      } catch (err) {
        const p = document.createElement("p");
        p.className = "help";
        p.textContent = `${model.name}: ${err.message}`;
        box.appendChild(p);
        continue;
      }
      const finite = values.flat().filter((v) => v !== null);
      const lo = Math.min(...finite), hi = Math.max(...finite);
      const table = document.createElement("table");
      table.className = "heads";
      table.dataset.model = m;
      const caption = table.createCaption();
      caption.textContent = model.name;
      for (const layer of model.layers) {
        const tr = table.insertRow();
        const th = document.createElement("th");
        th.className = layer.type;
        th.textContent = `L${layer.index} ${layer.type}${layer.window ? " W=" + layer.window : ""}`;
        th.title = `${layer.heads} heads (${layer.kv_heads} kv), qk ${layer.qk_dim}, v ${layer.v_dim}`;
        tr.appendChild(th);
        for (let h = 0; h < layer.heads; h++) {
          const td = tr.insertCell();
          const v = values[layer.index][h];
          td.className = "cell";
          td.dataset.layer = layer.index;
          td.dataset.head = h;
          const absent = layer.captured && !exported(m, layer.index, h);
          if (v === null || !layer.captured) {
            td.classList.add("missing");
            td.textContent = "–";
            td.title = layer.captured ? "no value" : "layer not captured";
          } else {
            const [r, g, b] = colour(hi > lo ? (v - lo) / (hi - lo) : 0.5);
            td.style.background = `rgb(${r},${g},${b})`;
            if (r * 0.3 + g * 0.6 + b * 0.1 > 140) td.classList.add("light");
            td.textContent = Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(2);
            td.title = `layer ${layer.index} head ${h}: ${v}`;
          }
          if (absent) {
            td.classList.add("absent");
            td.title += ` — not in this page: export again with --export-heads ${layer.index}.${h}`;
            td.addEventListener("click", () => status(`layer ${layer.index} head ${h} is not in this page: ` +
              `export again with --export-heads ${layer.index}.${h}, or run headprobe explore`));
          } else if (layer.captured) td.addEventListener("click", () => openHead(m, layer.index, h));
          const sel = state.heads[m];
          if (sel && sel.layer === layer.index && sel.head === h) td.classList.add("selected");
        }
      }
      box.appendChild(table);
    }
  }

  function exported(m, layer, head) {
    // whether this page holds the head's maps (a static export holds those it was asked for)
    if (!STATIC || !STATIC.export) return true;
    return STATIC.export.heads[m].some(([l, h]) => l === layer && h === head);
  }

  function openHead(m, layer, head) {
    state.heads[m] = { layer, head };
    // in compare mode the other model opens the same head where it has one
    state.info.models.forEach((model, i) => {
      if (i !== m && model.layers[layer] && head < model.layers[layer].heads && model.layers[layer].captured &&
          exported(i, layer, head)) {
        state.heads[i] = { layer, head };
      }
    });
    const L = state.info.models[m].layers[layer];
    document.getElementById("head-label").textContent =
      `layer ${layer} (${L.type}${L.window ? ", window " + L.window : ""}), head ${head}`;
    drawOverviews();
    redraw();
    if (state.needle) drawNeedle();
    if (state.row !== null) selectRow(m, state.row);
  }

  // ---- the map -----------------------------------------------------------------------------------
  function geometry(m) {
    const model = state.info.models[m];
    const L = model.length;
    const ppt = (state.view.zoom * MAP_SIZE) / L;
    const level = Math.max(0, Math.min(model.top_level, Math.floor(Math.log2(Math.max(1, 1 / ppt)))));
    return { L, ppt, level, x0: state.view.u0 * L, y0: state.view.v0 * L, model };
  }

  function tileEmpty(model, window, level, row, col) {
    const span = state.info.tile << level, L = model.length;
    const q0 = row * span, q1 = Math.min(L, q0 + span), k0 = col * span, k1 = Math.min(L, k0 + span);
    if (q0 >= q1 || k0 >= k1 || k0 > q1 - 1) return true;
    return window !== null && k1 - 1 < q0 - window + 1;
  }

  function tileKey(m, layer, head, level, row, col) {
    return `${m}/${layer}/${head}/${level}/${row}/${col}`;
  }

  function visibleColumns(meta, window, i) {
    // pixel columns [lo, hi) of pixel row i that some query of the row's block sees; the rest are 0
    // (export.py visible_columns: the same rule)
    const { block, q0, k0, cols } = meta;
    const qa = q0 + i * block;
    const hi = Math.min(cols, Math.max(0, Math.floor((qa + block - 1 - k0) / block) + 1));
    const lo = window === null ? 0 : Math.min(cols, Math.max(0, Math.ceil((qa - window + 2 - block - k0) / block)));
    return [lo, Math.max(lo, hi)];
  }

  function tileValues(meta, window) {
    // the server sends float32; an export uint16 codes of log10(value / max) for the visible pixels only
    // (export.py encode_tile / decode_tile)
    const bytes = Uint8Array.from(atob(meta.data), (c) => c.charCodeAt(0));
    if (!STATIC || !STATIC.tiles) return new Float32Array(bytes.buffer);
    const { decades, codes } = STATIC.tiles;
    const coded = new DataView(bytes.buffer);
    const values = new Float32Array(meta.rows * meta.cols);
    let n = 0;
    for (let i = 0; i < meta.rows; i++) {
      const [lo, hi] = visibleColumns(meta, window, i);
      for (let j = lo; j < hi; j++, n++) {
        const c = coded.getUint16(2 * n, true);
        values[i * meta.cols + j] = c === 0 ? 0 : meta.max * 10 ** (((c - 1) / (codes - 1)) * decades - decades);
      }
    }
    return values;
  }

  function embedded(m, level) {
    // whether this page holds the zoom level (a static export holds the coarsest it was asked for)
    return !STATIC || !STATIC.export || STATIC.export.levels[m].includes(level);
  }

  function requestTile(m, layer, head, level, row, col) {
    const key = tileKey(m, layer, head, level, row, col);
    if (tiles.has(key)) return tiles.get(key);
    const entry = { loading: !!embedded(m, level) };
    tiles.set(key, entry);
    if (!entry.loading) return entry;  // drawn from the finest coarser level the page holds
    api("tile", { model: m, layer, head, level, row, col })
      .then((meta) => {
        entry.values = tileValues(meta, state.info.models[m].layers[layer].window);
        entry.meta = meta;
        entry.loading = false;
        scheduleRedraw();
      })
      .catch((err) => {
        entry.loading = false;
        entry.error = err.message;
        status(err.message);
      });
    return entry;
  }

  function levelMax(m, layer, head, level) {
    let vmax = 0;
    for (const [key, t] of tiles) {
      if (t.meta && key.startsWith(`${m}/${layer}/${head}/${level}/`)) vmax = Math.max(vmax, t.meta.max);
    }
    return vmax;
  }

  function tileImage(entry, vmax, window) {
    const imageKey = `${state.scale}/${vmax}`;
    if (entry.image && entry.imageKey === imageKey) return entry.image;
    const { rows, cols } = entry.meta;
    const canvas = document.createElement("canvas");
    canvas.width = cols;
    canvas.height = rows;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(cols, rows);
    const bg = state.cmap.background;
    for (let i = 0; i < rows; i++) {
      const [lo, hi] = visibleColumns(entry.meta, window, i);
      for (let j = 0; j < cols; j++) {
        const unseen = j < lo || j >= hi;
        const rgb = unseen ? bg : colour(shade(entry.values[i * cols + j], vmax));
        const o = 4 * (i * cols + j);
        img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    entry.image = canvas;
    entry.imageKey = imageKey;
    return canvas;
  }

  let redrawQueued = false;
  function scheduleRedraw() {
    if (redrawQueued) return;
    redrawQueued = true;
    requestAnimationFrame(() => { redrawQueued = false; redraw(); });
  }

  function redraw() {
    state.labels = [];
    state.maps.forEach((canvas, m) => drawMap(m, canvas));
  }

  function drawMap(m, canvas) {
    const ctx = canvas.getContext("2d");
    const bg = state.cmap.background;
    ctx.fillStyle = `rgb(${bg.join(",")})`;
    ctx.fillRect(0, 0, MAP_SIZE, MAP_SIZE);
    const sel = state.heads[m];
    if (!sel) return;
    const g = geometry(m);
    const layer = g.model.layers[sel.layer];
    const window = layer.window;
    const span = state.info.tile << g.level;
    const n = Math.ceil(g.L / span);
    const last = (y) => Math.min(n - 1, Math.floor(y / span));
    const r0 = Math.max(0, Math.floor(g.y0 / span)), r1 = last(g.y0 + MAP_SIZE / g.ppt);
    const c0 = Math.max(0, Math.floor(g.x0 / span)), c1 = last(g.x0 + MAP_SIZE / g.ppt);
    let vmax = levelMax(m, sel.layer, sel.head, g.level);
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, 0, Math.min(MAP_SIZE, (g.L - g.x0) * g.ppt), Math.min(MAP_SIZE, (g.L - g.y0) * g.ppt));
    ctx.clip();
    ctx.imageSmoothingEnabled = false;
    const wanted = [];
    for (let r = r0; r <= r1; r++) {
      for (let c = c0; c <= Math.min(c1, r); c++) {
        if (!tileEmpty(g.model, window, g.level, r, c)) wanted.push([r, c]);
      }
    }
    for (const [r, c] of wanted) requestTile(m, sel.layer, sel.head, g.level, r, c);
    if (STATIC && STATIC.export) {
      const finest = Math.min(...STATIC.export.levels[m]);
      status(g.level < finest
        ? `zoomed past this page's finest level (${1 << finest} tokens a pixel), shown magnified: ` +
          "export with more --export-levels, or run headprobe explore"
        : STATIC_STATUS);
    }
    vmax = levelMax(m, sel.layer, sel.head, g.level);
    state.vmax = vmax;
    for (const [r, c] of wanted) {
      const entry = tiles.get(tileKey(m, sel.layer, sel.head, g.level, r, c));
      if (entry && entry.meta) {
        drawTile(ctx, g, entry, tileImage(entry, vmax, window));
      } else {
        drawCoarser(ctx, g, m, sel, window, r, c);
      }
    }
    ctx.restore();
    if (document.getElementById("marks").checked) drawOverlays(ctx, g, m, window);
    if (g.ppt >= LABEL_PPT) drawLabels(ctx, g, m, sel, window);
  }

  function drawTile(ctx, g, entry, image, sub) {
    const { block, q0, k0, rows, cols } = entry.meta;
    if (!sub) {
      ctx.drawImage(image, (k0 - g.x0) * g.ppt, (q0 - g.y0) * g.ppt, cols * block * g.ppt, rows * block * g.ppt);
      return;
    }
    const [sx, sy, sw, sh] = sub;
    ctx.drawImage(image, sx, sy, sw, sh,
      (k0 + sx * block - g.x0) * g.ppt, (q0 + sy * block - g.y0) * g.ppt, sw * block * g.ppt, sh * block * g.ppt);
  }

  function drawCoarser(ctx, g, m, sel, window, r, c) {
    // while a tile loads (or when an export lacks it) draw the part of the finest coarser tile at hand
    for (let lv = g.level + 1; lv <= g.model.top_level; lv++) {
      const f = 1 << (lv - g.level);
      const entry = tiles.get(tileKey(m, sel.layer, sel.head, lv, Math.floor(r / f), Math.floor(c / f)));
      if (!entry || !entry.meta) {
        if (STATIC && !entry) requestTile(m, sel.layer, sel.head, lv, Math.floor(r / f), Math.floor(c / f));
        continue;
      }
      const size = state.info.tile / f;
      const sx = (c % f) * size, sy = (r % f) * size;
      const sw = Math.min(size, entry.meta.cols - sx), sh = Math.min(size, entry.meta.rows - sy);
      if (sw > 0 && sh > 0) drawTile(ctx, g, entry, tileImage(entry, levelMax(m, sel.layer, sel.head, lv), window), [sx, sy, sw, sh]);
      return;
    }
  }

  function drawOverlays(ctx, g, m, window) {
    const model = g.model;
    const X = (k) => (k - g.x0) * g.ppt, Y = (q) => (q - g.y0) * g.ppt;
    ctx.save();
    ctx.lineWidth = 1;
    ctx.strokeStyle = "rgba(255,128,0,0.9)";
    ctx.beginPath(); ctx.moveTo(X(0), Y(0)); ctx.lineTo(X(g.L), Y(g.L)); ctx.stroke();  // the diagonal
    if (window !== null) {  // the sliding band's far edge: key = query - window + 1
      ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(X(0), Y(window - 1)); ctx.lineTo(X(g.L - window + 1), Y(g.L)); ctx.stroke();
      ctx.setLineDash([]);
    }
    ctx.fillStyle = "rgba(204,51,51,0.25)";
    for (const [a, b] of model.spans) ctx.fillRect(X(a), 0, Math.max(1, (b - a) * g.ppt), MAP_SIZE);
    if (model.question) {
      ctx.fillStyle = "rgba(51,153,204,0.2)";
      const [a, b] = model.question;
      ctx.fillRect(0, Y(a), MAP_SIZE, Math.max(1, (b - a) * g.ppt));
    }
    if (state.row !== null) {
      ctx.strokeStyle = "rgba(255,136,0,1)";
      ctx.strokeRect(0, Y(state.row), MAP_SIZE, Math.max(1, g.ppt));
    }
    ctx.restore();
  }

  function drawLabels(ctx, g, m, sel, window) {
    // token level: probabilities in the cells, key tokens along the top edge, query tokens along the left
    const k0 = Math.max(0, Math.floor(g.x0)), k1 = Math.min(g.L, Math.ceil(g.x0 + MAP_SIZE / g.ppt));
    const q0 = Math.max(0, Math.floor(g.y0)), q1 = Math.min(g.L, Math.ceil(g.y0 + MAP_SIZE / g.ppt));
    const keys = tokensAt(m, k0, k1), queries = tokensAt(m, q0, q1);
    ctx.save();
    ctx.font = "10px ui-monospace, monospace";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (let q = q0; q < q1; q++) {
      for (let k = k0; k < k1; k++) {
        const visible = k <= q && (window === null || q - k < window);
        if (!visible) continue;
        const p = valueAt(m, sel, 0, q, k);
        if (p === null) continue;
        const [r, gg, b] = colour(shade(p, state.vmax));
        ctx.fillStyle = r * 0.3 + gg * 0.6 + b * 0.1 > 140 ? "#000" : "#fff";
        ctx.fillText(p === 0 ? "0" : p < 0.01 ? p.toExponential(0) : p.toFixed(2), (k - g.x0 + 0.5) * g.ppt, (q - g.y0 + 0.5) * g.ppt);
      }
    }
    ctx.fillStyle = "rgba(255,255,255,0.85)";
    ctx.fillRect(0, 0, MAP_SIZE, 14);
    ctx.fillRect(0, 0, 14, MAP_SIZE);
    ctx.fillStyle = "#000";
    const show = (text) => JSON.stringify(text).slice(1, -1).slice(0, Math.max(1, Math.floor(g.ppt / 6)));
    if (keys) keys.forEach((t, i) => {
      ctx.fillText(show(t), (k0 + i - g.x0 + 0.5) * g.ppt, 7);
      state.labels.push({ model: m, axis: "key", pos: k0 + i, text: t });
    });
    if (queries) queries.forEach((t, i) => {
      ctx.save();
      ctx.translate(7, (q0 + i - g.y0 + 0.5) * g.ppt);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(show(t), 0, 0);
      ctx.restore();
      state.labels.push({ model: m, axis: "query", pos: q0 + i, text: t });
    });
    ctx.restore();
  }

  function valueAt(m, sel, level, q, k) {
    const span = state.info.tile << level;
    const entry = tiles.get(tileKey(m, sel.layer, sel.head, level, Math.floor(q / span), Math.floor(k / span)));
    if (!entry || !entry.meta) return null;
    const i = Math.floor((q - entry.meta.q0) / entry.meta.block), j = Math.floor((k - entry.meta.k0) / entry.meta.block);
    return entry.values[i * entry.meta.cols + j];
  }

  // ---- tokens ------------------------------------------------------------------------------------
  function tokensAt(m, start, end) {
    // token texts start..end-1 when loaded (else starts loading them and returns null)
    if (!tokenCache.has(m)) tokenCache.set(m, new Map());
    const cache = tokenCache.get(m);
    const out = [];
    let missing = false;
    for (let c = Math.floor(start / TOKEN_CHUNK); c * TOKEN_CHUNK < end; c++) {
      const chunk = cache.get(c);
      if (!chunk) {
        missing = true;
        cache.set(c, null);
        const L = state.info.models[m].length;
        api("tokens", { model: m, start: c * TOKEN_CHUNK, end: Math.min(L, (c + 1) * TOKEN_CHUNK) })
          .then((r) => { cache.set(c, r.tokens); scheduleRedraw(); drawTokens(); })
          .catch((err) => status(err.message));
      } else if (chunk === null) {
        missing = true;
      } else {
        out.push(...chunk);
      }
    }
    if (missing) return null;
    const first = Math.floor(start / TOKEN_CHUNK) * TOKEN_CHUNK;
    return out.slice(start - first, end - first);
  }

  const TOKEN_SPAN = 300;
  function drawTokens() {
    const m = 0;
    const model = state.info.models[m];
    const focus = state.focus ?? (model.question ? model.question[0] : model.length - 1);
    const start = Math.max(0, focus - TOKEN_SPAN), end = Math.min(model.length, focus + TOKEN_SPAN);
    const texts = tokensAt(m, start, end);
    const box = document.getElementById("tokens");
    if (!texts) { box.textContent = "loading tokens…"; return; }
    box.innerHTML = "";
    const inSpan = (p) => model.spans.some(([a, b]) => p >= a && p < b);
    const top = new Map();
    if (state.rowData) state.rowData.keys.forEach((k, i) => top.set(k, state.rowData.probs[i]));
    texts.forEach((t, i) => {
      const pos = start + i;
      const span = document.createElement("span");
      span.className = "tok";
      span.dataset.pos = pos;
      span.textContent = t;
      span.title = `token ${pos}`;
      if (inSpan(pos)) span.classList.add("span");
      if (model.question && pos >= model.question[0] && pos < model.question[1]) span.classList.add("question");
      if (pos === state.row) span.classList.add("query");
      if (top.has(pos)) {
        span.classList.add("topkey");
        span.style.background = `rgba(255,140,0,${Math.min(1, 0.15 + top.get(pos))})`;
        span.title += `: p = ${top.get(pos).toFixed(4)}`;
      }
      span.addEventListener("click", () => selectRow(m, pos));
      box.appendChild(span);
    });
    const q = box.querySelector(`[data-pos="${focus}"]`);
    if (q && q.scrollIntoView) q.scrollIntoView({ block: "center" });
  }

  async function selectRow(m, pos) {
    state.row = pos;
    const sel = state.heads[m];
    state.focus = pos;
    if (!sel) { drawTokens(); redraw(); return; }
    try {
      state.rowData = await api("row", { model: m, layer: sel.layer, head: sel.head, pos, k: 10 });
    } catch (err) {
      state.rowData = null;
      status(err.message);
    }
    const info = document.getElementById("row-info");
    const topk = document.getElementById("topk");
    topk.innerHTML = "";
    if (state.rowData) {
      const r = state.rowData;
      info.textContent = `query ${pos}, layer ${sel.layer} head ${sel.head}: entropy ${r.entropy.toFixed(3)} nats ` +
        `(${r.norm_entropy.toFixed(3)} normalised) over ${r.visible} keys`;
      r.keys.forEach((k, i) => {
        const a = document.createElement("a");
        a.dataset.pos = k;
        a.textContent = `${k} (${r.probs[i].toFixed(3)})`;
        a.addEventListener("click", () => centerOn(pos, k));
        topk.appendChild(a);
      });
    }
    drawTokens();
    redraw();
  }

  function centerOn(q, k) {
    const L = state.info.models[0].length;
    state.focus = k;
    state.view.zoom = Math.max(state.view.zoom, (LABEL_PPT * L) / MAP_SIZE);  // token level
    const half = 0.5 / state.view.zoom;
    state.view.u0 = k / L - half;
    state.view.v0 = q / L - half;
    drawTokens();
    redraw();
  }

  // ---- the needle view ---------------------------------------------------------------------------
  async function drawNeedle() {
    const model = state.info.models[0];
    if (!model.spans.length) return;
    document.getElementById("needle-panel").hidden = false;
    document.getElementById("to-needle").hidden = false;
    document.getElementById("to-question").hidden = !model.question;
    const box = document.getElementById("needle");
    let ev = state.needle;
    try {
      ev = ev || (await api("needle", { model: 0 }));
    } catch (err) {
      box.textContent = err.message;
      return;
    }
    state.needle = ev;
    const sel = state.heads[0];
    const p = document.createElement("p");
    p.textContent = `generated: ${JSON.stringify(ev.answer)} — expected: ${ev.expected.map((a) => JSON.stringify(a)).join(", ")}`;
    box.innerHTML = "";
    box.appendChild(p);
    if (sel) {
      const v = (grid) => (grid && grid[sel.layer][sel.head] !== null ? grid[sel.layer][sel.head].toFixed(3) : "n/a");
      const line = document.createElement("p");
      line.id = "needle-head";
      line.textContent = `layer ${sel.layer} head ${sel.head}: retrieval score ${v(ev.retrieval)}, ` +
        `mass on the answer span at the question rows ${v(ev.needle_mass)}`;
      box.appendChild(line);
    }
    const table = document.createElement("table");
    table.innerHTML = "<tr><th>step</th><th>token</th><th>argmax key of the open head</th><th>copies?</th></tr>";
    ev.tokens.forEach((tok, step) => {
      const tr = table.insertRow();
      const where = sel ? ev.argmax[step][sel.layer][sel.head] : null;
      const inside = where !== null && ev.spans.some(([a, b]) => where >= a && where < b);
      tr.insertCell().textContent = step;
      tr.insertCell().textContent = JSON.stringify(ev.texts[step]);
      const cell = tr.insertCell();
      cell.textContent = where === null ? "open a head" : `${where}${inside ? " (in the answer span)" : ""}`;
      if (where !== null) { cell.style.cursor = "pointer"; cell.addEventListener("click", () => centerOn(model.length - 1, where)); }
      const copy = tr.insertCell();
      copy.textContent = inside ? "copy" : "";
      copy.className = inside ? "copy" : "";
    });
    box.appendChild(table);
  }

  // ---- interaction -------------------------------------------------------------------------------
  function attach(canvas, m) {
    let drag = null;
    canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      zoomAt(e.offsetX, e.offsetY, e.deltaY < 0 ? 1.25 : 0.8);
    }, { passive: false });
    canvas.addEventListener("mousedown", (e) => { drag = { x: e.offsetX, y: e.offsetY, moved: false }; });
    canvas.addEventListener("mousemove", (e) => {
      const g = geometry(m);
      const k = Math.floor(g.x0 + e.offsetX / g.ppt), q = Math.floor(g.y0 + e.offsetY / g.ppt);
      const sel = state.heads[m];
      let text = `query ${q}, key ${k}`;
      if (sel && q >= 0 && k >= 0 && q < g.L && k < g.L) {
        const v = valueAt(m, sel, g.level, q, k);
        if (v !== null) text += `, mass ${v.toPrecision(3)} (block ${1 << g.level})`;
      }
      document.getElementById("hover").textContent = text;
      if (!drag) return;
      const dx = e.offsetX - drag.x, dy = e.offsetY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true;
      const unit = state.view.zoom * MAP_SIZE;
      state.view.u0 -= dx / unit;
      state.view.v0 -= dy / unit;
      drag.x = e.offsetX; drag.y = e.offsetY;
      scheduleRedraw();
    });
    canvas.addEventListener("mouseup", (e) => {
      if (drag && !drag.moved) {
        const g = geometry(m);
        const q = Math.floor(g.y0 + e.offsetY / g.ppt);
        if (q >= 0 && q < g.L) selectRow(m, q);
      }
      drag = null;
    });
    canvas.addEventListener("mouseleave", () => { drag = null; });
    canvas.addEventListener("dblclick", (e) => zoomAt(e.offsetX, e.offsetY, 2));
  }

  function zoomAt(px, py, factor) {
    const v = state.view;
    const L = Math.min(...state.info.models.map((mm) => mm.length));
    const zoom = Math.min((MAX_PPT * L) / MAP_SIZE, Math.max(1, v.zoom * factor));
    const u = v.u0 + px / (v.zoom * MAP_SIZE), w = v.v0 + py / (v.zoom * MAP_SIZE);
    v.u0 = u - px / (zoom * MAP_SIZE);
    v.v0 = w - py / (zoom * MAP_SIZE);
    v.zoom = zoom;
    scheduleRedraw();
  }

  function setView(view) {
    Object.assign(state.view, view);
    redraw();
  }

  function idle() {
    // resolves once no request is in flight and the maps are redrawn with what arrived
    return new Promise((resolve) => {
      const check = () => {
        if (state.pending === 0 && !redrawQueued) { redraw(); resolve(); } else setTimeout(check, 30);
      };
      setTimeout(check, 30);
    });
  }

  async function start() {
    state.cmap = STATIC ? STATIC.colormap : await (await fetch("static/colormap.json")).json();
    state.info = await api("info");
    const models = state.info.models;
    document.getElementById("input-label").textContent = models.map((m) => `${m.name}: ${m.label}`).join(" | ");
    const metric = document.getElementById("metric");
    for (const [name, [label]] of Object.entries(models[0].metrics)) {
      const o = document.createElement("option");
      o.value = name;
      o.textContent = label;
      metric.appendChild(o);
    }
    const help = () => {
      const [, description] = models[0].metrics[state.metric] || ["", ""];
      document.getElementById("metric-help").textContent = `${description} (rows: ${models[0].rows})`;
    };
    metric.addEventListener("change", () => { state.metric = metric.value; help(); drawOverviews(); });
    help();
    document.getElementById("scale").addEventListener("change", (e) => { state.scale = e.target.value; redraw(); });
    document.getElementById("marks").addEventListener("change", redraw);
    document.getElementById("reset").addEventListener("click", () => setView({ u0: 0, v0: 0, zoom: 1 }));
    document.getElementById("to-needle").addEventListener("click", () => {
      const [a] = models[0].spans[0];
      centerOn(models[0].question ? models[0].question[0] : models[0].length - 1, a);
    });
    document.getElementById("to-question").addEventListener("click", () => selectRow(0, models[0].question[1] - 1));
    const maps = document.getElementById("maps");
    if (models.length > 1) MAP_SIZE = 400;
    models.forEach((model, m) => {
      const div = document.createElement("div");
      div.className = "map";
      const title = document.createElement("span");
      title.className = "title";
      title.textContent = `${model.name} (${model.length.toLocaleString()} tokens)`;
      const canvas = document.createElement("canvas");
      canvas.width = canvas.height = MAP_SIZE;
      canvas.dataset.model = m;
      div.append(title, canvas);
      maps.appendChild(div);
      attach(canvas, m);
      state.maps.push(canvas);
    });
    await drawOverviews();
    drawTokens();
    await drawNeedle();
    redraw();
    if (STATIC && STATIC.export) {
      const note = document.getElementById("export-note");
      note.textContent = STATIC.export.note;
      note.hidden = false;
    }
    if (STATIC) status(STATIC_STATUS);
  }

  document.addEventListener("DOMContentLoaded", () => start().catch((err) => status(err.message)));
  return { state, tiles, api, openHead, selectRow, setView, idle, colour, shade, redraw, centerOn, mapSize: () => MAP_SIZE };
})();
window.hp = hp;
