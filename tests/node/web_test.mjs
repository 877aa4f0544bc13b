// tests/node/web_test.mjs TPSERVE REPO [--shots DIR] - tpserve's web page (GET /)
// in the system Chromium (puppeteer-core, no browser download) against real
// servers on 127.0.0.1 and a stand-in server that serves tpserve's own page
// with scripted chat answers (slow streams, HTML in model output, errors).
// Exits 0 when every check passed, 1 with the failed check named otherwise.
// --shots DIR also writes DIR/web-chat.png and DIR/web-cluster.png (2 ranks).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const [tpserve, repo] = process.argv.slice(2);
const shotsAt = process.argv.indexOf('--shots');
const shots = shotsAt > 0 ? process.argv[shotsAt + 1] : null;
const model = path.join(repo, 'models/stories260K.gguf');
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
const procs = new Set();
let browser = null;

function check(cond, what) {
  if (!cond) throw new Error('FAILED: ' + what);
  console.log('ok - ' + what);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// `tpserve serve` as world ranks on 127.0.0.1; resolves once rank 0 serves.
async function startServer(world, extra = []) {
  const coord = world > 1 ? await freePort() : 0;
  const ranks = [];
  for (let r = 0; r < world; r++) {
    const env = Object.assign({}, process.env);
    if (world > 1) Object.assign(env, { TP_RANK: String(r), TP_WORLD_SIZE: String(world), TP_COORDINATOR: '127.0.0.1:' + coord, TP_COMM_TIMEOUT_MS: '10000' });
    const p = spawn(tpserve, ['serve', '-m', model, '--port', '0', '--threads', '1', ...extra], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    procs.add(p);
    p.on('exit', () => procs.delete(p));
    p.stderr.on('data', () => {});
    ranks.push(p);
  }
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error('tpserve did not report its port in 60 s')), 60000);
    ranks[0].stdout.on('data', (d) => {
      out += d;
      const m = /serving on http:\/\/[0-9.]+:(\d+)/.exec(out);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    ranks[0].on('exit', (c) => reject(new Error('tpserve exited with ' + c + ' before serving')));
  });
  return { port, ranks, base: 'http://127.0.0.1:' + port };
}

async function stopServer(s) {
  for (const p of s.ranks) if (p.exitCode === null && p.signalCode === null) p.kill('SIGTERM');
  await Promise.all(s.ranks.map((p) => (p.exitCode !== null || p.signalCode !== null ? null : new Promise((r) => { const t = setTimeout(() => { p.kill('SIGKILL'); r(); }, 10000); p.on('exit', () => { clearTimeout(t); r(); }); }))));
}

// The oracle: the same conversation through the API, non-streaming.
async function apiReply(base, messages, params, key) {
  const h = { 'Content-Type': 'application/json' };
  if (key) h.Authorization = 'Bearer ' + key;
  const r = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: h, body: JSON.stringify(Object.assign({ messages }, params)) });
  if (!r.ok) throw new Error('oracle request: ' + r.status + ' ' + (await r.text()));
  return (await r.json()).choices[0].message.content;
}

// A page with its console errors, page errors, failed requests and every URL it asked for.
async function openPage(base) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  const log = { errors: [], urls: [], failed: [] };
  page.on('console', (m) => { if (m.type() === 'error') log.errors.push(m.text()); });
  page.on('pageerror', (e) => log.errors.push('pageerror: ' + e.message));
  page.on('request', (q) => log.urls.push(q.url()));
  page.on('requestfailed', (q) => log.failed.push(q.method() + ' ' + q.url() + ' ' + (q.failure() || {}).errorText));
  await page.goto(base + '/', { waitUntil: 'load' });
  return { page, log };
}

const waitReady = (page) => page.waitForFunction(() => /ready/.test(document.getElementById('status').textContent), { timeout: 30000 });

async function setSettings(page, temperature, maxTokens) {
  for (const [id, v] of [['temperature', temperature], ['max_tokens', maxTokens]]) {
    await page.$eval('#' + id, (e, val) => { e.value = val; e.dispatchEvent(new Event('change')); }, String(v));
  }
}

// Type a message, send it with Enter and wait for the reply to end.
async function chat(page, text) {
  const before = await page.$$eval('.msg', (a) => a.length);
  await page.type('#input', text);
  await page.keyboard.press('Enter');
  await page.waitForFunction((n) => document.querySelectorAll('.msg').length === n + 2 && !document.getElementById('send').disabled &&
    document.querySelector('.msg.assistant:last-child .meta').textContent !== '', { timeout: 60000 }, before);
  return page.evaluate(() => {
    const conv = JSON.parse(localStorage.getItem('tpserve.chat'));
    const last = document.querySelector('.msg.assistant:last-child');
    return { conv, text: last.querySelector('.content').textContent, meta: last.querySelector('.meta').textContent, error: document.getElementById('chat-error').hidden ? '' : document.getElementById('chat-error').textContent };
  });
}

const squash = (s) => s.replace(/\s+/g, '');

// ------------------------------------------------------------- stand-in server
// Serves tpserve's page (fetched from a real server, headers included) and
// scripted /v1/chat/completions answers, one per request from `script`.
async function startStub(real) {
  const assets = {};
  for (const f of ['/', '/app.js', '/style.css']) {
    const r = await fetch(real + f);
    assets[f] = { body: Buffer.from(await r.arrayBuffer()), headers: Object.fromEntries(['content-type', 'content-security-policy', 'x-tpserve-auth'].map((h) => [h, r.headers.get(h)])) };
  }
  const stub = { script: [], closedAt: null, chunksSent: 0, urls: [] };
  const chunk = (delta, finish) => 'data: ' + JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish || null }] }) + '\n\n';
  const server = http.createServer(async (req, res) => {
    stub.urls.push(req.url);
    if (assets[req.url] && (req.method === 'GET' || req.method === 'HEAD')) {
      res.writeHead(200, assets[req.url].headers);
      res.end(req.method === 'HEAD' ? undefined : assets[req.url].body);
      return;
    }
    if (req.url === '/v1/cluster') {
      const r = await fetch(real + '/v1/cluster');
      res.writeHead(r.status, { 'Content-Type': 'application/json' });
      res.end(await r.text());
      return;
    }
    if (req.url !== '/v1/chat/completions') { res.writeHead(404); res.end(); return; }
    for await (const _ of req) { /* read the body */ }
    const what = stub.script.shift();
    const err = (status, message) => { res.writeHead(status, { 'Content-Type': 'application/json' }); res.end(JSON.stringify({ error: { message, type: 'server_error', param: null, code: null } })); };
    if (what === '429') return err(429, 'the queue is full (64 waiting)');
    if (what === '503') return err(503, 'rank 1 has not answered for 1.4 s');
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    if (what === 'slow') {
      stub.closedAt = null;
      stub.chunksSent = 0;
      const t = setInterval(() => { stub.chunksSent++; res.write(chunk({ content: 'word' + stub.chunksSent + ' ' })); }, 50);
      res.on('close', () => { clearInterval(t); stub.closedAt = Date.now(); });
      return;
    }
    if (what === 'html') {
      res.write(chunk({ role: 'assistant', reasoning_content: 'thinking <b>hard</b> about <script>window.__pwned=3</script>' }));
      res.write(chunk({ content: 'Here: <script>window.__pwned=1</script> and <img src="/x-img" onerror="window.__pwned=2"> done.\n\n' }));
      res.write(chunk({ content: '```html\n<img src="/x-code" onerror="window.__pwned=4">\n```\n**bold <i>x</i>**' }));
      res.write(chunk({}, 'stop'));
      res.write('data: ' + JSON.stringify({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 9, total_tokens: 12 } }) + '\n\n');
      res.end('data: [DONE]\n\n');
      return;
    }
    if (what === 'midstream-error') {
      res.write(chunk({ content: 'Once' }));
      res.end('data: ' + JSON.stringify({ error: { message: 'the engine failed: rank 1 is gone', type: 'server_error' } }) + '\n\n');
      return;
    }
    res.end();
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  stub.base = 'http://127.0.0.1:' + server.address().port;
  stub.close = () => new Promise((r) => { server.closeAllConnections(); server.close(r); });
  return stub;
}

// ------------------------------------------------------------- the checks
async function main() {
  browser = await puppeteer.launch({
    executablePath: chromium, headless: true, protocolTimeout: 120000,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--no-default-browser-check', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-default-apps', '--disable-extensions'],
  });

  // 1. one rank, no key: the page, greedy chat, the conversation kept
  const s1 = await startServer(1);
  {
    const { page, log } = await openPage(s1.base);
    await waitReady(page);
    const paint = await page.evaluate(() => Object.fromEntries(performance.getEntriesByType('paint').map((e) => [e.name, e.startTime])));
    const size = await page.evaluate(async () => {
      let n = 0;
      for (const f of ['/', '/app.js', '/style.css']) n += (await (await fetch(f)).arrayBuffer()).byteLength;
      return n;
    });
    console.log(`# page: ${size} bytes (index.html + app.js + style.css); first paint ${num(paint['first-paint'])} ms, first contentful paint ${num(paint['first-contentful-paint'])} ms`);
    check(size < 300 * 1024, 'the page is under 300 KiB (' + size + ' bytes)');
    await setSettings(page, 0, 40);
    const a = await chat(page, 'Once upon a time');
    const want1 = await apiReply(s1.base, [{ role: 'user', content: 'Once upon a time' }], { temperature: 0, top_p: 0.95, max_tokens: 40 });
    check(want1.length > 0 && a.conv[1].content === want1, 'a streamed chat reply equals the API\'s greedy output');
    check(squash(a.text) === squash(want1), 'the reply shown on the page is that text');
    check(/\d+ tokens .* tok\/s .*TTFT \d+ ms/.test(a.meta), 'the reply shows tokens/s and time to first token (' + a.meta + ')');
    const b = await chat(page, 'What happened next?');
    const want2 = await apiReply(s1.base, [{ role: 'user', content: 'Once upon a time' }, { role: 'assistant', content: want1 }, { role: 'user', content: 'What happened next?' }], { temperature: 0, top_p: 0.95, max_tokens: 40 });
    check(b.conv.length === 4 && b.conv[3].content === want2, 'a second turn sends the whole conversation (greedy output equal)');
    await page.reload({ waitUntil: 'load' });
    check((await page.$$eval('.msg', (m) => m.length)) === 4, 'the conversation survives a reload (localStorage)');
    await page.click('#clear');
    check((await page.$$eval('.msg', (m) => m.length)) === 0, 'New conversation clears it');
    check(log.errors.length === 0, 'no console errors (' + log.errors.join(' | ') + ')');
    const outside = log.urls.filter((u) => !u.startsWith(s1.base + '/') && !u.startsWith('data:'));
    check(outside.length === 0, 'no request outside the server (' + outside.join(', ') + ')');
    check(log.failed.length === 0, 'no failed request (' + log.failed.join(', ') + ')');
    await page.close();
  }

  // 2. the stand-in server: stop, HTML in model output, reasoning, errors
  const stub = await startStub(s1.base);
  {
    const { page, log } = await openPage(stub.base);
    await waitReady(page);
    stub.script.push('slow');
    await page.type('#input', 'go');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => /word3/.test(document.querySelector('.msg.assistant:last-child .content').textContent), { timeout: 20000 });
    const tStop = Date.now();
    await page.click('#stop');
    await page.waitForFunction(() => !document.getElementById('send').disabled, { timeout: 5000 });
    await sleep(400);
    check(stub.closedAt !== null && stub.closedAt - tStop < 1000, 'Stop closes the stream (the server saw the connection close)');
    const st = await page.evaluate(() => ({ meta: document.querySelector('.msg.assistant:last-child .meta').textContent, conv: JSON.parse(localStorage.getItem('tpserve.chat')) }));
    check(/stopped/.test(st.meta) && /word3/.test(st.conv[1].content), 'the stopped reply is kept and marked stopped (' + st.meta + ')');
    await sleep(300);
    const after = await page.evaluate(() => JSON.parse(localStorage.getItem('tpserve.chat'))[1].content);
    check(after === st.conv[1].content, 'nothing is appended after Stop');

    stub.script.push('html');
    await page.type('#input', 'show me html');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => !document.getElementById('send').disabled && /done/.test(document.querySelector('.msg.assistant:last-child .content').textContent), { timeout: 20000 });
    await sleep(300);
    const x = await page.evaluate(() => {
      const last = document.querySelector('.msg.assistant:last-child');
      return {
        pwned: window.__pwned, tags: document.querySelectorAll('#messages script, #messages img, #messages i, #messages b').length,
        text: last.querySelector('.content').textContent, code: (last.querySelector('pre code') || {}).textContent,
        strong: (last.querySelector('strong') || {}).textContent,
        rHidden: last.querySelector('.reasoning').hidden, reasoning: last.querySelector('.reasoning-body').textContent,
      };
    });
    check(x.pwned === undefined && x.tags === 0, 'model output with <script> and <img onerror> runs nothing and adds no element');
    check(x.text.includes('<script>window.__pwned=1</script>') && x.text.includes('<img src="/x-img" onerror="window.__pwned=2">'), 'that output is shown as text');
    check(x.code === '<img src="/x-code" onerror="window.__pwned=4">\n', 'a fenced code block is a <pre><code> with the text');
    check(x.strong === 'bold <i>x</i>', 'Markdown bold is rendered, with its HTML as text');
    check(!x.rHidden && x.reasoning === 'thinking <b>hard</b> about <script>window.__pwned=3</script>', 'reasoning_content is shown apart, as text');
    check(!stub.urls.some((u) => /^\/x-/.test(u)) && !log.urls.some((u) => /\/x-/.test(u)), 'no image from model output was requested');

    for (const [what, re] of [['429', /busy \(429/], ['503', /503\): rank 1 has not answered for 1\.4 s/], ['midstream-error', /The reply stopped: the engine failed: rank 1 is gone/]]) {
      stub.script.push(what);
      await page.type('#input', 'again');
      await page.keyboard.press('Enter');
      await page.waitForFunction(() => !document.getElementById('chat-error').hidden && !document.getElementById('send').disabled, { timeout: 20000 });
      const e = await page.$eval('#chat-error', (n) => n.textContent);
      check(re.test(e), what + ' is reported clearly (' + e + ')');
      if (what !== 'midstream-error') {
        const back = await page.evaluate(() => ({ input: document.getElementById('input').value, n: JSON.parse(localStorage.getItem('tpserve.chat')).length }));
        check(back.input === 'again' && back.n === 4, 'a refused turn is taken out of the conversation and its text put back');
        await page.$eval('#input', (n) => { n.value = ''; });
      }
    }
    check(log.errors.filter((e) => !/status of (429|503)/.test(e)).length === 0, 'no console errors besides the scripted 429/503 (' + log.errors.join(' | ') + ')');
    await page.close();
  }
  await stub.close();

  // 3. the benchmark view reads bench nodes' JSON
  {
    const file = path.join(repo, 'docs/bench/nodes-tinyllama-1.1b-q4_0-10gbe-t1.json');
    const j = JSON.parse(fs.readFileSync(file, 'utf8'));
    const { page, log } = await openPage(s1.base);
    await page.click('.tab[data-view=bench]');
    const input = await page.$('#bench-file');
    await input.uploadFile(file);
    await page.waitForSelector('.bench-table tr[data-nodes]', { timeout: 10000 });
    const rows = await page.$$eval('.bench-table tr[data-nodes]', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
    const ok = j.runs.filter((r) => r.ok);
    check(rows.length === ok.length && rows.every((r, i) => Number(r[0]) === ok[i].nodes && r[2] === ok[i].tg_tps.toFixed(2) &&
      r[3] === ok[i].compute_ms.toFixed(3) && r[4] === ok[i].comm_ms.toFixed(3)), 'the benchmark view shows tokens/s and compute/comm per node count from the file');
    check((await page.$$eval('.bench-chart rect.cm', (a) => a.length)) === ok.length, 'with a compute/communication bar per node count');
    check(log.errors.length === 0, 'no console errors in the benchmark view');
    await page.close();
  }
  await stopServer(s1);

  // 4. an API key: the page asks for it, refuses a wrong one, then works
  const s2 = await startServer(1, ['--api-key', 'web-secret']);
  {
    const { page, log } = await openPage(s2.base);
    await page.waitForSelector('#key-dialog[open]', { timeout: 10000 });
    check(true, 'with --api-key the page asks for the key');
    await page.type('#key-input', 'wrong');
    await page.click('#key-ok');
    await page.waitForFunction(() => document.getElementById('key-dialog').open && !document.getElementById('key-error').hidden, { timeout: 10000 });
    check(true, 'a wrong key is refused and asked again');
    await page.type('#key-input', 'web-secret');
    await page.click('#key-ok');
    await waitReady(page);
    await setSettings(page, 0, 16);
    const a = await chat(page, 'Hello');
    const want = await apiReply(s2.base, [{ role: 'user', content: 'Hello' }], { temperature: 0, max_tokens: 16 }, 'web-secret');
    check(a.conv[1].content === want, 'with the key the chat works (greedy output equal)');
    check((await page.evaluate(() => sessionStorage.getItem('tpserve.api_key'))) === 'web-secret', 'the key is kept in sessionStorage');
    check(log.errors.filter((e) => !/status of 401/.test(e)).length === 0, 'no console errors besides the wrong key\'s 401');
    await page.close();
  }
  await stopServer(s2);

  // 5. two ranks: the cluster view, then a worker killed
  const s3 = await startServer(2);
  {
    const { page, log } = await openPage(s3.base);
    await waitReady(page);
    await setSettings(page, 0.8, 120);
    await page.$eval('#system', (e) => { e.value = 'You tell short stories.'; });
    await chat(page, 'Tell me about a cat.');
    await chat(page, 'And a dog?');
    for (let i = 0; i < 6; i++) await apiReply(s3.base, [{ role: 'user', content: 'Once upon a time ' + i }], { max_tokens: 200 });
    if (shots) await page.screenshot({ path: path.join(shots, 'web-chat.png') });
    await page.click('.tab[data-view=cluster]');
    if (shots) {
      // history for the plot: requests of varying length for 40 s, the screenshot while they run
      for (let t = Date.now(), i = 0; Date.now() - t < 40000; i++) {
        await apiReply(s3.base, [{ role: 'user', content: 'Story ' + i }], { max_tokens: 20 + (i % 7) * 40 });
        await sleep(150 + (i % 5) * 120);
      }
      await page.screenshot({ path: path.join(shots, 'web-cluster.png'), fullPage: true });
    }
    await page.waitForFunction(() => document.querySelectorAll('.card[data-state=ready]').length === 2 && document.querySelector('.card[data-rank="1"] [data-field=bytes_sent]').dataset.value !== '0', { timeout: 20000 });
    await sleep(1200);
    const shown = await page.evaluate(() => {
      const out = { state: window.tpserve.state(), cards: {} };
      for (const c of document.querySelectorAll('.card')) {
        const f = {};
        for (const v of c.querySelectorAll('[data-field]')) f[v.dataset.field] = v.dataset.value;
        out.cards[c.dataset.rank] = f;
      }
      return out;
    });
    const cl = await (await fetch(s3.base + '/v1/cluster')).json();
    check(cl.ranks.length === 2 && Object.keys(shown.cards).length === 2, 'the cluster view shows both ranks');
    for (const r of cl.ranks)
      for (const k of ['weight_bytes', 'kv_bytes', 'mem_total_bytes'])
        check(Number(shown.cards[r.rank][k]) === r[k] && r[k] > 0, `rank ${r.rank} ${k} on the page equals /v1/cluster (${r[k]})`);
    for (const r of shown.state.ranks)
      check(Number(shown.cards[r.rank].rss_bytes) === r.rss_bytes && Number(shown.cards[r.rank].bytes_sent) === r.bytes_sent, `rank ${r.rank} resident memory and bytes sent are the last /v1/cluster answer's`);
    // the plot needs two samples a second apart of the page's own polling
    const plotted = await page.waitForFunction(() => { const p = document.querySelector('#plot polyline'); return p && p.getAttribute('points').split(' ').length >= 2; }, { timeout: 10000 }).then(() => true, () => false);
    check(plotted, 'the tokens/s plot has points');
    // a stopped worker (SIGSTOP) is lost while the heartbeats miss it, then recovers (SIGCONT)
    const cardState = (r) => page.evaluate((rank) => (document.querySelector(`.card[data-rank="${rank}"]`) || { dataset: {} }).dataset.state, r);
    const waitState = async (rank, states, ms) => {
      const t = Date.now();
      try {
        await page.waitForFunction((r, ss) => ss.includes((document.querySelector(`.card[data-rank="${r}"]`) || { dataset: {} }).dataset.state), { timeout: ms, polling: 50 }, rank, states);
        return Date.now() - t;
      } catch (e) { return -1; }
    };
    process.kill(s3.ranks[1].pid, 'SIGSTOP');
    const stopMs = await waitState(1, ['lost'], 6000);
    console.log('# a stopped worker shown as lost after ' + stopMs + ' ms');
    check(stopMs >= 0 && stopMs <= 2000 && (await cardState(0)) === 'ready', 'a stopped worker is shown as lost within 2 s (' + stopMs + ' ms), rank 0 stays ready');
    process.kill(s3.ranks[1].pid, 'SIGCONT');
    check((await waitState(1, ['recovering', 'ready'], 4000)) >= 0, 'after SIGCONT it is shown as recovering or ready');
    check((await waitState(1, ['ready'], 6000)) >= 0, 'and then as ready');
    const t0 = Date.now();
    s3.ranks[1].kill('SIGKILL');
    let lostMs = -1;
    try {
      await page.waitForFunction(() => (document.querySelector('.card[data-rank="1"]') || {}).dataset?.state === 'lost', { timeout: 10000, polling: 50 });
      lostMs = Date.now() - t0;
    } catch (e) { lostMs = -1; }
    console.log('# a killed worker shown as lost after ' + lostMs + ' ms');
    check(lostMs >= 0 && lostMs <= 2000, 'a killed worker is shown as lost within 2 s (' + lostMs + ' ms)');
    check(/lost/.test(await page.$eval('#status', (e) => e.textContent)), 'the header says a rank is lost');
    check(log.errors.length === 0, 'no console errors in the cluster view (' + log.errors.join(' | ') + ')');
    await page.close();
  }
  await stopServer(s3);
}

function num(x) { return typeof x === 'number' ? x.toFixed(0) : '?'; }

let code = 0;
try { await main(); } catch (e) { console.log(e.message || e); code = 1; }
if (browser) await browser.close().catch(() => {});
for (const p of procs) p.kill('SIGKILL');
process.exit(code);
