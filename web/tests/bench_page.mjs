// What the browser benchmarks share: command-line options, and one headless Debian
// Chromium page (WebGPU on, no network, never a downloaded browser) on a local server.
import { chromium } from "playwright-core";
import { serve } from "../serve.mjs";

export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"];

/** `--name value` from this process's arguments, else `dflt`. */
export function option(name, dflt) {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : dflt;
}

/** Whether `--name` is among this process's arguments. */
export const flag = (name) => process.argv.slice(2).includes(`--${name}`);

/**
 * Serve the repository (and `mounts`), open `path` in headless Chromium, wait for the
 * page's `window.loaded`, and run `body(page)`. Console errors are echoed; a page error
 * or a throw from `body` exits 1, after the browser and server are closed.
 */
export async function withPage(path, body, { mounts = {} } = {}) {
  const { server, url } = await serve({ mounts });
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ARGS });
  let failed = false;
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(0);
    page.on("console", (m) => { if (m.type() === "error") console.log(`  [console] ${m.text()}`); });
    page.on("pageerror", (e) => { console.log(`  [pageerror] ${e.message}`); failed = true; });
    await page.goto(`${url}${path}`);
    await page.evaluate(() => window.loaded);
    if ((await body(page)) === false) failed = true;
  } catch (e) {
    console.log(`error: ${e.stack ?? e}`);
    failed = true;
  } finally {
    await browser.close();
    server.close();
  }
  process.exit(failed ? 1 : 0);
}
