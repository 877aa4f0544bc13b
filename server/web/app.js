// server/web/app.js - tpserve's web page: chat, cluster view, benchmark view.
// Plain JavaScript, no library, no network request outside this server.
// Model output and every string from a server or a file reach the page only
// as text nodes (textContent / createTextNode); nothing is parsed as HTML.
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const SVGNS = 'http://www.w3.org/2000/svg';

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function bytes(n) {
    if (n === null || n === undefined || !isFinite(n)) return '?';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + u[i];
  }
  function num(n, d) { return isFinite(n) ? Number(n).toFixed(d) : '-'; }
  function showError(box, text) {
    box.hidden = !text;
    box.textContent = text || '';
  }

  // ---------------------------------------------------------------- API key
  const KEY_ITEM = 'tpserve.api_key';
  let apiKey = sessionStorage.getItem(KEY_ITEM) || '';
  let keyPromise = null;

  // Ask for the key once, however many calls are waiting for it.
  function askKey(message) {
    if (keyPromise) return keyPromise;
    keyPromise = new Promise((resolve) => {
      const dlg = $('key-dialog');
      showError($('key-error'), message || '');
      $('key-input').value = '';
      $('key-form').onsubmit = (ev) => {
        ev.preventDefault();
        const k = $('key-input').value.trim();
        if (!k) return;
        apiKey = k;
        sessionStorage.setItem(KEY_ITEM, k);
        dlg.close();
        keyPromise = null;
        resolve();
      };
      dlg.oncancel = (ev) => ev.preventDefault(); // Escape: the page cannot work without the key
      if (!dlg.open) dlg.showModal();
    });
    return keyPromise;
  }

  function headers(json) {
    const h = {};
    if (json) h['Content-Type'] = 'application/json';
    if (apiKey) h.Authorization = 'Bearer ' + apiKey;
    return h;
  }

  // fetch with the key; a 401 asks for a (new) key and retries.
  async function api(path, opts) {
    opts = opts || {};
    for (;;) {
      if (keyPromise) await keyPromise;
      const r = await fetch(path, Object.assign({}, opts, { headers: headers(!!opts.body) }));
      if (r.status !== 401) return r;
      await askKey(apiKey ? 'The server refused that key; try again.' : '');
    }
  }

  // The error text of an OpenAI-style error answer.
  async function errorText(r) {
    let msg = '';
    try { msg = ((await r.json()).error || {}).message || ''; } catch (e) { msg = ''; }
    if (r.status === 429) return 'The server is busy (429: its queue is full). Retry in a moment.' + (msg ? ' ' + msg : '');
    if (r.status === 503) return 'The server cannot answer now (503): ' + (msg || 'unavailable') + '.';
    if (r.status === 413) return 'The conversation is too long for the server (413): ' + msg;
    return 'Error ' + r.status + ': ' + (msg || r.statusText);
  }

  // ---------------------------------------------------------------- views
  let view = 'chat';
  function show(v) {
    view = v;
    for (const b of document.querySelectorAll('.tab')) b.classList.toggle('active', b.dataset.view === v);
    for (const s of document.querySelectorAll('.view')) s.hidden = s.id !== 'view-' + v;
  }
  for (const b of document.querySelectorAll('.tab')) b.addEventListener('click', () => show(b.dataset.view));

  // ---------------------------------------------------------------- Markdown
  // A small, safe subset: fenced code blocks, headings, lists, paragraphs,
  // `code`, **bold**, *italic*.  Built as DOM nodes from text.
  function inline(parent, text) {
    const re = /(`[^`\n]+`|\*\*[^*\n]+\*\*|\*[^*\s][^*\n]*\*)/g;
    let last = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      const t = m[0];
      if (t[0] === '`') parent.appendChild(el('code', null, t.slice(1, -1)));
      else if (t.startsWith('**')) parent.appendChild(el('strong', null, t.slice(2, -2)));
      else parent.appendChild(el('em', null, t.slice(1, -1)));
      last = m.index + t.length;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function blocks(parent, text) {
    const lines = text.split('\n');
    let para = null;
    let list = null;
    for (const line of lines) {
      const h = /^(#{1,6})\s+(.*)$/.exec(line);
      const li = /^\s*(?:[-*+]|\d+[.)])\s+(.*)$/.exec(line);
      if (!line.trim()) { para = null; list = null; continue; }
      if (h) {
        para = null; list = null;
        const e = el('h' + Math.min(6, h[1].length + 2));
        inline(e, h[2]);
        parent.appendChild(e);
      } else if (li) {
        para = null;
        if (!list) { list = el(/^\s*\d/.test(line) ? 'ol' : 'ul'); parent.appendChild(list); }
        const e = el('li');
        inline(e, li[1]);
        list.appendChild(e);
      } else {
        list = null;
        if (!para) { para = el('p'); parent.appendChild(para); } else para.appendChild(el('br'));
        inline(para, line);
      }
    }
  }

  function renderMarkdown(parent, text) {
    parent.replaceChildren();
    const re = /```([^\n`]*)\n?([\s\S]*?)(?:```|$)/g;
    let last = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      if (m[0] === '') { re.lastIndex++; continue; }
      if (m.index > last) blocks(parent, text.slice(last, m.index));
      const pre = el('pre');
      const code = el('code', null, m[2]);
      if (m[1].trim()) pre.dataset.lang = m[1].trim();
      pre.appendChild(code);
      parent.appendChild(pre);
      last = m.index + m[0].length;
    }
    if (last < text.length) blocks(parent, text.slice(last));
  }

  // ---------------------------------------------------------------- chat
  const CHAT_ITEM = 'tpserve.chat';
  const SETTINGS_ITEM = 'tpserve.settings';
  let conv = [];
  try { conv = JSON.parse(localStorage.getItem(CHAT_ITEM) || '[]'); } catch (e) { conv = []; }
  if (!Array.isArray(conv)) conv = [];
  let controller = null;

  const settingIds = ['system', 'temperature', 'top_p', 'max_tokens'];
  try {
    const st = JSON.parse(localStorage.getItem(SETTINGS_ITEM) || '{}');
    for (const id of settingIds) if (typeof st[id] === 'string') $(id).value = st[id];
  } catch (e) { /* defaults */ }
  for (const id of settingIds)
    $(id).addEventListener('change', () => {
      const st = {};
      for (const k of settingIds) st[k] = $(k).value;
      localStorage.setItem(SETTINGS_ITEM, JSON.stringify(st));
    });

  function save() { localStorage.setItem(CHAT_ITEM, JSON.stringify(conv)); }

  function messageNode(m) {
    const box = el('div', 'msg ' + (m.role === 'user' ? 'user' : 'assistant'));
    box.appendChild(el('div', 'role', m.role === 'user' ? 'You' : 'Model'));
    const reasoning = el('details', 'reasoning');
    reasoning.appendChild(el('summary', null, 'reasoning'));
    const rbody = el('div', 'reasoning-body');
    reasoning.appendChild(rbody);
    reasoning.hidden = !m.reasoning;
    box.appendChild(reasoning);
    const body = el('div', 'content');
    box.appendChild(body);
    const meta = el('div', 'meta');
    box.appendChild(meta);
    const node = { box, body, rbody, reasoning, meta };
    fill(node, m);
    return node;
  }

  function fill(node, m) {
    if (m.role === 'user') node.body.textContent = m.content;
    else renderMarkdown(node.body, m.content || '');
    node.reasoning.hidden = !m.reasoning;
    node.rbody.textContent = m.reasoning || '';
    const s = m.stats;
    let meta = '';
    if (s) {
      meta = s.tokens + ' tokens';
      if (s.tps !== null && s.tps !== undefined) meta += ' \u00b7 ' + num(s.tps, 1) + ' tok/s';
      if (s.ttft_ms !== null && s.ttft_ms !== undefined) meta += ' \u00b7 TTFT ' + num(s.ttft_ms, 0) + ' ms';
      if (s.finish) meta += ' \u00b7 ' + s.finish;
    }
    node.meta.textContent = meta;
  }

  function renderChat() {
    const box = $('messages');
    box.replaceChildren();
    for (const m of conv) box.appendChild(messageNode(m).box);
    box.scrollTop = box.scrollHeight;
  }

  function busy(on) {
    $('send').disabled = on;
    $('stop').disabled = !on;
  }

  function number(id, lo, hi, int) {
    const v = Number($(id).value);
    if (!isFinite(v) || v < lo || v > hi || (int && !Number.isInteger(v))) throw new Error(id.replace('_', ' ') + ' must be a number from ' + lo + ' to ' + hi);
    return v;
  }

  async function send(text) {
    showError($('chat-error'), '');
    let params;
    try {
      params = { temperature: number('temperature', 0, 2), top_p: number('top_p', 0, 1), max_tokens: number('max_tokens', 1, 1 << 20, true) };
    } catch (e) { showError($('chat-error'), e.message); return; }
    conv.push({ role: 'user', content: text });
    const reply = { role: 'assistant', content: '', reasoning: '', stats: null };
    const messages = [];
    const system = $('system').value.trim();
    if (system) messages.push({ role: 'system', content: system });
    for (const m of conv) messages.push({ role: m.role, content: m.content });
    conv.push(reply);
    save();
    renderChat();
    const node = messageNode(reply);
    const box = $('messages');
    box.lastChild.replaceWith(node.box);
    controller = new AbortController();
    busy(true);
    const t0 = performance.now();
    let tFirst = null;
    let chunks = 0;
    let usage = null;
    let finish = null;
    let pending = false;
    const redraw = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => { pending = false; fill(node, reply); box.scrollTop = box.scrollHeight; });
    };
    try {
      const body = Object.assign({ messages, stream: true, stream_options: { include_usage: true } }, params);
      const r = await api('/v1/chat/completions', { method: 'POST', body: JSON.stringify(body), signal: controller.signal });
      if (!r.ok) throw new Error(await errorText(r));
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      let done = false;
      while (!done) {
        const { done: eof, value } = await reader.read();
        if (eof) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while (!done && (i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data:')) continue;
            const data = line.slice(5).trim();
            if (data === '[DONE]') { done = true; break; }
            const j = JSON.parse(data);
            if (j.error) throw new Error('The reply stopped: ' + (j.error.message || 'server error') + '.');
            if (j.usage) usage = j.usage;
            const ch = (j.choices || [])[0];
            if (!ch) continue;
            const d = ch.delta || {};
            if (typeof d.reasoning_content === 'string' && d.reasoning_content) { reply.reasoning += d.reasoning_content; chunks++; }
            if (typeof d.content === 'string' && d.content) { reply.content += d.content; chunks++; }
            if ((d.content || d.reasoning_content) && tFirst === null) tFirst = performance.now();
            if (ch.finish_reason) finish = ch.finish_reason;
            redraw();
          }
        }
      }
      if (!done) throw new Error('The connection to the server was lost before the reply ended.');
    } catch (e) {
      if (e.name === 'AbortError') finish = 'stopped';
      else { showError($('chat-error'), e instanceof TypeError ? 'Cannot reach the server: ' + e.message : e.message); finish = finish || 'error'; }
    }
    const tEnd = performance.now();
    const tokens = usage && usage.completion_tokens ? usage.completion_tokens : chunks;
    reply.stats = {
      tokens,
      ttft_ms: tFirst === null ? null : tFirst - t0,
      // decode rate after the first token; end to end when the reply came in one burst
      tps: tFirst === null || tokens < 1 ? null
        : tEnd - tFirst >= 20 && tokens > 1 ? (tokens - 1) / ((tEnd - tFirst) / 1000) : tokens / ((tEnd - t0) / 1000),
      finish,
    };
    controller = null;
    busy(false);
    if (finish === 'error' && !reply.content && !reply.reasoning) {
      // nothing came back: take the turn out (roles keep alternating) and give the text back
      conv.splice(-2, 2);
      save();
      renderChat();
      if (!$('input').value) $('input').value = text;
      return;
    }
    save();
    fill(node, reply);
  }

  $('composer').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = $('input').value;
    if (!text.trim() || controller) return;
    $('input').value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('composer').requestSubmit(); }
  });
  $('stop').addEventListener('click', () => { if (controller) controller.abort(); });
  $('clear').addEventListener('click', () => {
    if (controller) controller.abort();
    conv = [];
    save();
    renderChat();
    showError($('chat-error'), '');
  });

  // ---------------------------------------------------------------- cluster
  let cluster = null;

  function bar(parts, total) {
    const b = el('div', 'bar');
    for (const [cls, v, title] of parts) {
      const s = el('span', 'seg ' + cls);
      s.style.width = total > 0 ? Math.max(0, Math.min(100, (100 * v) / total)).toFixed(2) + '%' : '0';
      if (v > 0) s.style.minWidth = '2px'; // a small share stays visible
      s.title = title;
      b.appendChild(s);
    }
    return b;
  }

  function field(parent, label, name, value, text) {
    const row = el('div', 'field');
    row.appendChild(el('span', 'k', label));
    const v = el('span', 'v', text);
    v.dataset.field = name;
    v.dataset.value = String(value);
    row.appendChild(v);
    parent.appendChild(row);
  }

  function range(a) { return a ? a[0] + '-' + (a[1] - 1) + ' (' + (a[1] - a[0]) + ')' : '-'; }

  function rankCard(r, model) {
    const card = el('div', 'card state-' + r.state);
    card.dataset.rank = String(r.rank);
    card.dataset.state = r.state;
    const h = el('h3', null, 'rank ' + r.rank + ' ');
    h.appendChild(el('span', 'badge', r.state + (r.state === 'loading' && r.progress !== undefined ? ' ' + num(100 * r.progress, 0) + '%' : '')));
    card.appendChild(h);
    if (r.host === undefined) return card;
    card.appendChild(el('div', 'host', r.host + ' \u00b7 ' + r.backend + ' \u00b7 ' + r.link));
    const used = r.weight_bytes + r.kv_bytes;
    card.appendChild(bar([['w', r.weight_bytes, 'weights'], ['kv', r.kv_bytes, 'KV cache']], r.mem_total_bytes));
    field(card, 'weights', 'weight_bytes', r.weight_bytes, bytes(r.weight_bytes));
    field(card, 'KV cache', 'kv_bytes', r.kv_bytes, bytes(r.kv_bytes));
    field(card, 'resident (process)', 'rss_bytes', r.rss_bytes, bytes(r.rss_bytes));
    field(card, 'machine memory', 'mem_total_bytes', r.mem_total_bytes,
      bytes(r.mem_total_bytes) + (r.mem_total_bytes ? ' (' + num((100 * used) / r.mem_total_bytes, 2) + '% held)' : ''));
    const s = r.share || {};
    field(card, 'share', 'fraction', s.fraction, num(100 * s.fraction, 1) + '% of the sharded weights');
    field(card, 'layers', 'layers', s.layers, (s.layers ? s.layers[1] - s.layers[0] : '?') + ' (a slice of each)');
    field(card, 'query heads', 'q_heads', s.q_heads, range(s.q_heads) + (model.n_head ? ' of ' + model.n_head : ''));
    field(card, 'KV heads', 'kv_heads', s.kv_heads, range(s.kv_heads) + (model.n_head_kv ? ' of ' + model.n_head_kv : ''));
    field(card, 'FFN columns', 'ffn', s.ffn, range(s.ffn) + (model.n_ff ? ' of ' + model.n_ff : ''));
    if (s.experts) field(card, 'experts', 'experts', s.experts, range(s.experts));
    const tot = r.compute_ms_per_token + r.comm_ms_per_token;
    card.appendChild(bar([['cp', r.compute_ms_per_token, 'compute'], ['cm', r.comm_ms_per_token, 'communication']], tot));
    field(card, 'compute/comm', 'time', tot, num(r.compute_ms_per_token, 3) + ' / ' + num(r.comm_ms_per_token, 3) + ' ms/token');
    field(card, 'sent', 'bytes_sent', r.bytes_sent, bytes(r.bytes_sent) + ' over ' + r.n_tokens + ' tokens');
    return card;
  }

  function plot(history, now) {
    const g = $('plot');
    g.replaceChildren();
    const W = Math.max(200, Math.round(g.getBoundingClientRect().width) || 600);
    const H = 120;
    g.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    // the last 5 minutes, or since the first sample (at least a minute)
    const first = history && history.length ? history[0][0] : now;
    const span = Math.min(300, Math.max(60, now - first));
    const pts = (history || []).filter((p) => p[0] >= now - span);
    const max = Math.max(1, ...pts.map((p) => p[1]));
    g.appendChild(svg('line', { x1: 0, y1: H - 1, x2: W, y2: H - 1, class: 'axis' }));
    g.appendChild(svg('text', { x: 4, y: 12, class: 'label' }, num(max, 1) + ' tok/s'));
    g.appendChild(svg('text', { x: 4, y: H - 4, class: 'label' }, '-' + Math.round(span) + ' s'));
    g.appendChild(svg('text', { x: W - 30, y: H - 4, class: 'label' }, 'now'));
    if (pts.length < 2) return;
    const xy = pts.map((p) => ((W * (p[0] - (now - span))) / span).toFixed(1) + ',' + (H - 2 - ((H - 16) * p[1]) / max).toFixed(1));
    g.appendChild(svg('polyline', { points: xy.join(' '), class: 'line' }));
  }

  function renderCluster(c) {
    $('c-tps').textContent = num(c.tokens_per_s, 1);
    $('c-active').textContent = c.active_seqs + ' / ' + c.n_parallel;
    $('c-queue').textContent = String(c.queue_depth);
    $('c-gen').textContent = String(c.n_generated);
    const m = c.model || {};
    $('c-model').textContent = (m.id || '?') + (m.n_layer ? ' \u00b7 ' + m.n_layer + ' layers \u00b7 ' + bytes(m.weight_bytes) + ' weights' : '') +
      (c.backend ? ' \u00b7 ' + c.backend + (c.transport && c.transport !== 'none' ? ' over ' + c.transport : '') + ', ' +
        c.wire_dtype + ' on the wire' : '');
    showError($('cluster-error'), c.reason ? 'The cluster is ' + c.state + ': ' + c.reason : '');
    const box = $('ranks');
    box.replaceChildren();
    for (const r of c.ranks || []) box.appendChild(rankCard(r, m));
    plot(c.history, c.time);
  }

  function setStatus(text, cls) {
    const s = $('status');
    s.textContent = text;
    s.className = 'status ' + (cls || '');
  }

  async function poll() {
    const t0 = performance.now();
    try {
      const r = await api('/v1/cluster', { cache: 'no-store' });
      if (!r.ok) throw new Error(await errorText(r));
      cluster = await r.json();
      const lost = (cluster.ranks || []).filter((x) => x.state === 'lost').map((x) => x.rank);
      if (cluster.state === 'loading') setStatus('loading the model ' + num(100 * (cluster.load.total_bytes ? cluster.load.done_bytes / cluster.load.total_bytes : 0), 0) + '%', 'warn');
      else if (lost.length) setStatus('rank ' + lost.join(', ') + ' lost', 'bad');
      else if (cluster.state !== 'ready') setStatus(cluster.state, 'bad');
      else setStatus((cluster.model.id || 'model') + ' \u00b7 ' + cluster.n_ranks + (cluster.n_ranks === 1 ? ' rank' : ' ranks') + ' \u00b7 ready', 'ok');
      renderCluster(cluster);
    } catch (e) {
      setStatus('server unreachable', 'bad');
      showError($('cluster-error'), e instanceof TypeError ? 'Cannot reach the server.' : e.message);
    }
    setTimeout(poll, Math.max(0, 1000 - (performance.now() - t0))); // one poll a second, however long it took
  }

  // ---------------------------------------------------------------- benchmark
  function renderBench(j) {
    const out = $('bench-out');
    out.replaceChildren();
    if (!j || !Array.isArray(j.runs)) throw new Error('not a bench nodes JSON file (no "runs" array)');
    const runs = j.runs.filter((r) => r && r.ok && isFinite(r.nodes) && isFinite(r.tg_tps));
    if (!runs.length) throw new Error('the file has no successful run');
    out.appendChild(el('p', null, 'model ' + j.model + ' \u00b7 link ' + j.link + ' \u00b7 ' + j.prompt_tokens + ' prompt + ' + j.gen_tokens + ' generated tokens'));
    const W = 640;
    const rowH = 34;
    const H = 30 + rowH * runs.length;
    const maxT = Math.max(...runs.map((r) => Math.max(r.tg_tps, r.projected_tg_tps || 0)));
    const maxMs = Math.max(...runs.map((r) => (r.compute_ms || 0) + (r.comm_ms || 0)));
    const g = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, class: 'bench-chart', role: 'img' });
    g.appendChild(svg('text', { x: 60, y: 14, class: 'label' }, 'decode tokens/s: measured; dashed: projected, dedicated machines'));
    g.appendChild(svg('text', { x: 360, y: 14, class: 'label' }, 'ms per token: compute + communication'));
    runs.forEach((r, i) => {
      const y = 24 + i * rowH;
      g.appendChild(svg('text', { x: 4, y: y + 16, class: 'label' }, r.nodes + (r.nodes === 1 ? ' node' : ' nodes')));
      const w = (240 * r.tg_tps) / maxT;
      g.appendChild(svg('rect', { x: 60, y, width: w.toFixed(1), height: 20, class: 'tps' }));
      g.appendChild(svg('text', { x: 64 + w, y: y + 14, class: 'label' }, num(r.tg_tps, 1)));
      if (r.projected_tg_tps) {
        const px = 60 + (240 * r.projected_tg_tps) / maxT;
        g.appendChild(svg('line', { x1: px, y1: y - 2, x2: px, y2: y + 22, class: 'proj' }));
      }
      const cw = (240 * (r.compute_ms || 0)) / maxMs;
      const mw = (240 * (r.comm_ms || 0)) / maxMs;
      g.appendChild(svg('rect', { x: 360, y, width: cw.toFixed(1), height: 20, class: 'cp' }));
      g.appendChild(svg('rect', { x: 360 + cw, y, width: mw.toFixed(1), height: 20, class: 'cm' }));
      g.appendChild(svg('text', { x: 364 + cw + mw, y: y + 14, class: 'label' }, num(r.compute_ms, 2) + ' + ' + num(r.comm_ms, 2)));
    });
    out.appendChild(g);
    const t = el('table', 'bench-table');
    const head = el('tr');
    for (const k of ['nodes', 'prefill tok/s', 'decode tok/s', 'compute ms', 'comm ms', 'bytes/token', 'max RSS', 'projected tok/s'])
      head.appendChild(el('th', null, k));
    t.appendChild(head);
    for (const r of runs) {
      const tr = el('tr');
      tr.dataset.nodes = String(r.nodes);
      for (const v of [r.nodes, num(r.pp_tps, 1), num(r.tg_tps, 2), num(r.compute_ms, 3), num(r.comm_ms, 3), num(r.bytes_per_token, 0), bytes(r.rss_bytes_max), num(r.projected_tg_tps, 2)])
        tr.appendChild(el('td', null, v));
      t.appendChild(tr);
    }
    out.appendChild(t);
  }

  $('bench-file').addEventListener('change', () => {
    const f = $('bench-file').files[0];
    if (!f) return;
    const rd = new FileReader();
    rd.onload = () => {
      try { showError($('bench-error'), ''); renderBench(JSON.parse(String(rd.result))); } catch (e) { showError($('bench-error'), f.name + ': ' + e.message); }
    };
    rd.onerror = () => showError($('bench-error'), f.name + ': could not be read');
    rd.readAsText(f);
  });

  // ---------------------------------------------------------------- start
  async function start() {
    renderChat();
    // GET / says whether the API needs a key, so the page asks before its first call
    try {
      const r = await fetch('/', { cache: 'no-store' });
      await r.arrayBuffer();
      if (r.headers.get('X-Tpserve-Auth') === 'required' && !apiKey) askKey('');
    } catch (e) { /* poll() reports an unreachable server */ }
    poll();
  }
  window.tpserve = { renderMarkdown, renderBench, state: () => cluster }; // for tests and the console
  start();
})();
