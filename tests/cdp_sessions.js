// Drives headless Chromium over the DevTools protocol (Node's own
// WebSocket and fetch, no packages) for tests/metrics.rs: opens the admin
// service's sessions page, prints its text, clicks the "end" button of one
// session, and prints the page it lands on.
//
// node --experimental-websocket cdp_sessions.js CHROMIUM PROFILE_DIR URL BUTTON_ID
// Prints lines: "PAGE1 <json text>", "CLICKED", "PAGE2 <json text>".
"use strict";
const { spawn } = require("child_process");
const fs = require("fs");
const path = require("path");

const [chromium, profile, url, button] = process.argv.slice(2);
const deadline = Date.now() + 60000;
const browser = spawn(chromium, [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
  "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync",
  "--user-data-dir=" + profile, "--remote-debugging-port=0", "about:blank",
], { stdio: ["ignore", "ignore", "pipe"] });
let stderr = "";
browser.stderr.on("data", (d) => { stderr += d; });

function fail(why) {
  console.log("FAIL " + why + "\n" + stderr.slice(-2000));
  try { browser.kill("SIGKILL"); } catch (e) {}
  process.exit(1);
}
setTimeout(() => fail("timed out"), 60000).unref();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const portFile = path.join(profile, "DevToolsActivePort");
  let port;
  while (!port) {
    if (Date.now() > deadline) fail("no DevToolsActivePort");
    try { port = fs.readFileSync(portFile, "utf8").split("\n")[0].trim(); } catch (e) {}
    if (!port) await sleep(100);
  }
  let target;
  while (!target) {
    try {
      const list = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
      target = list.find((t) => t.type === "page");
    } catch (e) {}
    if (!target) await sleep(100);
  }
  const ws = new WebSocket(target.webSocketDebuggerUrl);
  await new Promise((ok, no) => { ws.onopen = ok; ws.onerror = () => no(new Error("ws")); });
  let next = 1;
  const waiting = new Map();
  const events = [];
  ws.onmessage = (m) => {
    const msg = JSON.parse(m.data);
    if (msg.id && waiting.has(msg.id)) { waiting.get(msg.id)(msg); waiting.delete(msg.id); }
    else if (msg.method) events.push(msg.method);
  };
  const call = (method, params = {}) => new Promise((ok) => {
    const id = next++;
    waiting.set(id, ok);
    ws.send(JSON.stringify({ id, method, params }));
  });
  const loaded = async () => {
    while (!events.includes("Page.loadEventFired")) await sleep(50);
    events.length = 0;
  };
  const text = async () => {
    const r = await call("Runtime.evaluate", { expression: "document.body.innerText", returnByValue: true });
    return r.result.result.value;
  };
  await call("Page.enable");
  events.length = 0;
  await call("Page.navigate", { url });
  await loaded();
  console.log("PAGE1 " + JSON.stringify(await text()));
  const r = await call("Runtime.evaluate", {
    expression: `(() => { const b = document.getElementById(${JSON.stringify(button)}); if (!b) return false; b.click(); return true; })()`,
    returnByValue: true,
  });
  if (!r.result.result.value) fail("no button " + button);
  console.log("CLICKED");
  await loaded();
  console.log("PAGE2 " + JSON.stringify(await text()));
  await call("Browser.close").catch(() => {});
  browser.kill("SIGKILL");
  process.exit(0);
}
main().catch((e) => fail(String(e)));
