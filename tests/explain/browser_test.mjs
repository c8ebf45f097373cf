// tests/explain/browser_test.mjs: the explain report in a real browser.
//
// Debian's chromium, driven by playwright-core (never a downloaded browser),
// loads the page that `multihead explain` wrote, over file://, and checks:
//  - the head view's SVG, its lines and the token labels, the per-head
//    heatmaps and the average map are there;
//  - the lines drawn are exactly the (head, query, key) triples whose weight
//    in the page's embedded data is at least 0.5%, under each state:
//    all heads, one head off, one head alone, a focused query, a focused key;
//  - switching a head off changes the drawing, focusing a token changes
//    which lines are drawn, a click keeps the focus and a second releases it;
//  - the layer selector, the model's answer and a per-head measure, on a
//    copy of the page given a second layer of two heads, an answer and a
//    measure (the page shows them; a plain MHA file has one layer and
//    neither);
//  - the page makes no network request: every request but the page itself
//    fails the test (the listener is itself checked on a page that does
//    request an image);
//  - no script error; and it saves a screenshot PNG;
//  - with --trained T.html (`multihead explain`'s default: the shipped
//    lesson model on the lesson's sentence): its token labels are the
//    sentence's words (the keys then the padding), one layer entry per
//    layer of the model, the answer section names "animal" with a
//    probability, the measure section has a table per measure with H values
//    and the picked head marked where its data says; its screenshot too
//    (explain-trained.png).
//
// Usage: node browser_test.mjs --report R.html --node-modules DIR --work DIR
//        [--chromium /usr/bin/chromium] [--trained T.html]
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []));
const require = createRequire(path.join(path.resolve(args["node-modules"]), "noop.js"));
const { chromium } = require("playwright-core");
const executablePath = args.chromium || "/usr/bin/chromium";
const work = path.resolve(args.work);
const MIN_DRAWN = 0.005;  // src/explain/assets/report.js draws lines from this weight up

let passed = 0, failed = 0;
function check(name, ok, detail = "") {
  if (ok) passed++; else failed++;
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${ok ? "" : ": " + detail}`);
}

// The triples the page should draw, from its own data.
function expectedLines(layer, keep) {
  const out = [];
  for (let h = 0; h < layer.heads; h++)
    for (let i = 0; i < layer.queries; i++)
      for (let j = 0; j < layer.keys; j++)
        if (keep(h, i, j) && layer.weights[h][i][j] >= MIN_DRAWN) out.push(`${h},${i},${j}`);
  return out.sort();
}

async function drawnLines(page) {
  const lines = await page.$$eval("svg#head-view line.attn-line",
    (ls) => ls.map((l) => `${l.dataset.head},${l.dataset.query},${l.dataset.key}`));
  return lines.sort();
}

function same(a, b) { return a.length === b.length && a.every((x, k) => x === b[k]); }

function embeddedData(html) {
  const m = html.match(/<script type="application\/json" id="report-data">([\s\S]*?)<\/script>/);
  return JSON.parse(m[1]);
}

async function main() {
  fs.mkdirSync(work, { recursive: true });
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "multihead-explain-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync"],
    viewport: { width: 1200, height: 900 },
  });
  try {
    const html = fs.readFileSync(args.report, "utf8");
    const data = embeddedData(html);
    const layer = data.layers[0];
    const pageUrl = pathToFileURL(path.resolve(args.report)).href;

    // Every request is recorded; any but the page's own file is aborted and fails the test.
    const allowed = new Set([pageUrl]);
    const foreign = [];
    context.on("request", (r) => { if (!allowed.has(r.url())) foreign.push(r.url()); });
    await context.route("**/*", (route) => (allowed.has(route.request().url()) ? route.continue() : route.abort()));
    const errors = [];
    const page = await context.newPage();
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    page.on("websocket", (ws) => foreign.push(ws.url()));
    await page.goto(pageUrl, { waitUntil: "load" });
    await page.waitForSelector("body[data-ready='true']", { timeout: 10000 });

    // ---- structure and labels ------------------------------------------------
    check("head view SVG present", (await page.$$("svg#head-view")).length === 1);
    const queryLabels = await page.$$eval("svg#head-view text.query-token", (ts) => ts.map((t) => t.textContent));
    const keyLabels = await page.$$eval("svg#head-view text.key-token", (ts) => ts.map((t) => t.textContent));
    check("query token labels are the report's tokens", same(queryLabels, data.query_tokens),
          JSON.stringify(queryLabels));
    check("key token labels are the report's tokens", same(keyLabels, data.key_tokens), JSON.stringify(keyLabels));
    const maps = await page.$$eval("figure.map", (fs_) => fs_.map((f) => f.id));
    const wantMaps = [...Array(layer.heads).keys()].map((h) => `map-head-${h}`).concat(["map-average"]);
    check("one heatmap per head and the average map", same(maps, wantMaps), JSON.stringify(maps));
    const cells = await page.$$eval("svg.heatmap rect.cell", (rs) => rs.length);
    check("heatmap cells: (H + 1)·L·S", cells === (layer.heads + 1) * layer.queries * layer.keys, `${cells}`);
    const mapLabels = await page.$$eval("#map-head-0 text.query-label", (ts) => ts.map((t) => t.textContent));
    check("heatmaps carry the token labels", same(mapLabels, data.query_tokens), JSON.stringify(mapLabels));
    const toggles = await page.$$eval("button.head-toggle", (bs) => bs.length);
    check("one toggle per head", toggles === layer.heads, `${toggles}`);
    check("layer selector present (one layer: disabled)",
          await page.$eval("#layer-select", (s) => s.options.length === 1 && s.disabled));
    check("the four steps are explained", (await page.$$eval("#lesson ol li", (ls) => ls.length)) === 4);

    // ---- heads on and off ------------------------------------------------------
    const all = await drawnLines(page);
    check("all heads: the drawn lines are the weights >= 0.5%", same(all, expectedLines(layer, () => true)),
          `${all.length} lines`);
    await page.click("button.head-toggle[data-head='0']");
    const without0 = await drawnLines(page);
    check("head 1 off changes the drawing", !same(without0, all) && without0.length < all.length,
          `${without0.length} vs ${all.length}`);
    check("head 1 off: exactly the other heads' lines", same(without0, expectedLines(layer, (h) => h !== 0)));
    await page.click("button.head-toggle[data-head='0']");
    check("head 1 on again: the drawing is back", same(await drawnLines(page), all));
    await page.dblclick("button.head-toggle[data-head='2']");
    check("double-click: head 3 alone", same(await drawnLines(page), expectedLines(layer, (h) => h === 2)));
    await page.click("#all-heads");
    check("'all' restores every head", same(await drawnLines(page), all));

    // ---- focus -----------------------------------------------------------------
    const q = Math.min(7, layer.queries - 1);
    const queryToken = `svg#head-view text.query-token[data-index='${q}']`;
    await page.hover(queryToken);
    const focused = await drawnLines(page);
    check(`hover on query ${q}: only its lines`, same(focused, expectedLines(layer, (h, i) => i === q)),
          `${focused.length} lines`);
    check("focusing a token changes which lines are drawn", !same(focused, all));
    await page.mouse.move(1, 1);
    check("leaving the token: all lines again", same(await drawnLines(page), all));
    await page.click(queryToken);
    await page.mouse.move(1, 1);
    check("click keeps the focus after the pointer leaves", same(await drawnLines(page), focused));
    check("focused row marked in the heatmaps",
          await page.$eval("#map-head-0 rect.row-focus", (r) => r.getAttribute("visibility") === "visible"));
    await page.click(queryToken);
    await page.mouse.move(1, 1);
    check("a second click releases it", same(await drawnLines(page), all));
    const k = 1;
    await page.hover(`svg#head-view text.key-token[data-index='${k}']`);
    check(`hover on key ${k}: only the lines into it`,
          same(await drawnLines(page), expectedLines(layer, (h, i, j) => j === k)));
    await page.mouse.move(1, 1);

    // ---- screenshot --------------------------------------------------------------
    await page.click(queryToken);  // the picture shows one focused token, as a reader would
    const shot = path.join(work, "explain-report.png");
    await page.screenshot({ path: shot, fullPage: true });
    const png = fs.readFileSync(shot);
    check(`screenshot saved (${shot})`, png.length > 1000 && png.subarray(1, 4).toString() === "PNG");

    // ---- several layers ----------------------------------------------------------
    const two = structuredClone(data);
    const extra = { name: "layer 2", heads: 2, queries: layer.queries, keys: layer.keys,
                    weights: [layer.weights[layer.heads - 1], layer.weights[0]], average: layer.average };
    two.layers.push(extra);
    two.focus = -1;
    // What a trained model's report adds: its answer and a per-head measure.
    two.answer = { question: "What does \u201cit\u201d refer to?", answer: "animal", confidence: 0.875 };
    two.measures = [{ name: "it \u2192 referent", description: "attention mass, averaged over the test set.",
                      layer: 1, per_head: [0.125, 0.75], picked: 1 }];
    const json = JSON.stringify(two).replace(/</g, "\\u003c").replace(/>/g, "\\u003e").replace(/&/g, "\\u0026");
    const twoPath = path.join(work, "two-layers.html");
    fs.writeFileSync(twoPath, html.replace(/(<script type="application\/json" id="report-data">)[\s\S]*?(<\/script>)/,
                                           (_, open, close) => open + json + close));
    const twoUrl = pathToFileURL(twoPath).href;
    allowed.add(twoUrl);
    const page2 = await context.newPage();
    page2.on("pageerror", (e) => errors.push(String(e)));
    await page2.goto(twoUrl, { waitUntil: "load" });
    await page2.waitForSelector("body[data-ready='true']");
    check("two layers: selector enabled with two entries",
          await page2.$eval("#layer-select", (s) => s.options.length === 2 && !s.disabled));
    await page2.selectOption("#layer-select", "1");
    check("layer 2 selected: two head toggles", (await page2.$$eval("button.head-toggle", (bs) => bs.length)) === 2);
    check("layer 2 selected: its lines", same(await drawnLines(page2), expectedLines(extra, () => true)));
    check("layer 2 selected: two head maps and the average",
          same(await page2.$$eval("figure.map", (f) => f.map((x) => x.id)), ["map-head-0", "map-head-1", "map-average"]));
    check("answer shown", (await page2.$eval("#answer", (p) => p.textContent)) ===
          "What does \u201cit\u201d refer to? animal (probability 87.5%)");
    const measure = await page2.$$eval("table.measure td", (tds) => tds.map((t) => [t.textContent, t.className]));
    check("measure table: a value per head, the picked head marked",
          JSON.stringify(measure) === JSON.stringify([["0.125", ""], ["0.750", "picked"]]), JSON.stringify(measure));
    check("no answer or measure sections on the plain report",
          await page.$eval("#answer-section", (s) => s.hidden) && await page.$eval("#measures-section", (s) => s.hidden));
    await page2.close();

    // ---- the trained model's report -------------------------------------------------
    if (args.trained) {
      const tData = embeddedData(fs.readFileSync(args.trained, "utf8"));
      const tUrl = pathToFileURL(path.resolve(args.trained)).href;
      allowed.add(tUrl);
      const page3 = await context.newPage();
      page3.on("pageerror", (e) => errors.push(String(e)));
      page3.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
      await page3.goto(tUrl, { waitUntil: "load" });
      await page3.waitForSelector("body[data-ready='true']", { timeout: 10000 });
      const words = "the animal didn't cross the street because it was too tired".split(" ");
      const tq = await page3.$$eval("svg#head-view text.query-token", (ts) => ts.map((t) => t.textContent));
      const tk = await page3.$$eval("svg#head-view text.key-token", (ts) => ts.map((t) => t.textContent));
      check("trained: query labels are the lesson's words", same(tq.map((t) => t.toLowerCase()), words),
            JSON.stringify(tq));
      check("trained: key labels are the words, then the padding",
            same(tk.map((t) => t.toLowerCase()), words.concat(Array(tk.length - words.length).fill("<pad>"))) &&
            tk.length === 16, JSON.stringify(tk));
      const nLayers = tData.layers.length;
      check(`trained: layer selector has the model's ${nLayers} layer(s)`,
            await page3.$eval("#layer-select", (s, n) => s.options.length === n && s.disabled === (n === 1), nLayers));
      check("trained: one toggle per head", (await page3.$$eval("button.head-toggle", (bs) => bs.length)) ===
            tData.layers[0].heads);
      const answer = await page3.$eval("#answer", (p) => p.textContent);
      check("trained: answer section shown: \"it\" refers to animal, with its probability",
            !(await page3.$eval("#answer-section", (s) => s.hidden)) &&
            /^What does "it" refer to\? animal \(probability \d+(\.\d+)?%\)$/.test(answer), answer);
      const tables = await page3.$$eval("table.measure", (ts) => ts.map((t) =>
        [...t.rows[1].cells].slice(1).map((c) => [c.textContent, c.className])));
      const want = tData.measures.map((m) => m.per_head.map((v, h) => [v.toFixed(3), m.picked === h ? "picked" : ""]));
      // A measure marks its head only where a head has the role (the shipped
      // model has an adjective head but no referent head: its head 1.4
      // follows the subject), so a table has a mark exactly when its data picks.
      const picks = (m) => Number.isInteger(m.picked) && m.picked >= 0;
      check("trained: measure section: a table per measure, a value per head, the picked head marked",
            !(await page3.$eval("#measures-section", (s) => s.hidden)) && tables.length === 2 * nLayers &&
            JSON.stringify(tables) === JSON.stringify(want) &&
            tables.every((t, i) => t.some((c) => c[1] === "picked") === picks(tData.measures[i])) &&
            tData.measures.some(picks),
            JSON.stringify(tables));
      const tShot = path.join(work, "explain-trained.png");
      await page3.screenshot({ path: tShot, fullPage: true });
      const tPng = fs.readFileSync(tShot);
      check(`trained: screenshot saved (${tShot})`, tPng.length > 1000 && tPng.subarray(1, 4).toString() === "PNG");
      await page3.close();
    }

    check("no network request", foreign.length === 0, JSON.stringify(foreign));
    check("no script error", errors.length === 0, JSON.stringify(errors));

    // ---- the request listener itself catches a request ------------------------------
    const probePath = path.join(work, "probe.html");
    fs.writeFileSync(probePath, '<!DOCTYPE html><img src="http://127.0.0.1:9/probe.png">');
    const probeUrl = pathToFileURL(probePath).href;
    allowed.add(probeUrl);
    const probe = await context.newPage();
    await probe.goto(probeUrl, { waitUntil: "load" });
    check("the listener sees (and aborts) a page's request", same(foreign, ["http://127.0.0.1:9/probe.png"]),
          JSON.stringify(foreign));
  } finally {
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(`browser_test: ${e.stack || e}`);
  process.exit(1);
});
