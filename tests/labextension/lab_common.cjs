// What the browser scripts of tests/labextension share: Debian's headless Chromium through
// playwright-core (PLAYWRIGHT_CORE: the module path; nothing downloads a browser), a wider
// KCoral panel where a screenshot wants one, a measure of whether the panel fits its side
// bar, and the run around each script's own steps (the JSON line the pytest side reads).
'use strict';

const path = require('path');
const { chromium } = require(process.env.PLAYWRIGHT_CORE);

function launchBrowser(extraArgs = []) {
  return chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
      '--disable-dev-shm-usage',
      ...extraArgs
    ]
  });
}

// Best effort: hide the file browser and drag the right side bar wider than its default.
async function widenPanel(page, by = 260) {
  try {
    await page.evaluate(() => window.jupyterapp.shell.collapseLeft());
    const box = await page.locator('#kcoral-panel').boundingBox();
    const handles = page.locator('#jp-main-split-panel > .lm-SplitPanel-handle');
    for (let i = 0; i < (await handles.count()); i++) {
      const h = await handles.nth(i).boundingBox();
      if (h && box && Math.abs(h.x + h.width - box.x) < 12) {
        await page.mouse.move(h.x + h.width / 2, h.y + h.height / 2);
        await page.mouse.down();
        await page.mouse.move(h.x - by, h.y + h.height / 2, { steps: 5 });
        await page.mouse.up();
        break;
      }
    }
  } catch {
    // the layout is only cosmetic here
  }
}

// Whether the KCoral panel fits its side bar as it is now (issue 29.4): its width, the
// jobs table's, and the elements whose right edge passes the panel's (at most ten).
async function panelFit(page) {
  return page.evaluate(() => {
    const panel = document.querySelector('#kcoral-panel');
    const table = panel.querySelector('table.jp-KCoral-jobTable');
    const right = panel.getBoundingClientRect().right;
    const overflowing = [...panel.querySelectorAll('*')]
      .filter(n => n.getClientRects().length && n.getBoundingClientRect().right > right + 0.5)
      .map(n => `${n.tagName.toLowerCase()}.${n.className}: ${(n.textContent || '').slice(0, 40)}`)
      .slice(0, 10);
    // Cells cut short with an ellipsis: any header, and any status, time or submitted cell
    // (only the worker column may give way; its tooltip has the whole text).
    const cut = [...panel.querySelectorAll('.jp-KCoral-jobTable th, .jp-KCoral-jobTable td')]
      .filter(c => c.tagName === 'TH' || c.cellIndex !== 2)
      .filter(c => c.scrollWidth > c.clientWidth)
      .map(c => c.textContent);
    return {
      cut,
      panelClientWidth: panel.clientWidth,
      panelScrollWidth: panel.scrollWidth,
      tableScrollWidth: table ? table.scrollWidth : 0,
      sideBarWidth: Math.round(panel.parentElement.getBoundingClientRect().width),
      overflowing
    };
  });
}

// Waits until the notebook in front has a kernel and it is idle (a fresh JupyterLab starts
// the kernel after the page has loaded).
async function kernelIdle(page) {
  await page.waitForFunction(
    () => {
      const w = window.jupyterapp.shell.currentWidget;
      return w && w.sessionContext && w.sessionContext.session?.kernel?.status === 'idle';
    },
    null,
    { timeout: 90000 }
  );
}

// What a script saw, and `step` to note a milestone in it (with its time).
function recorder() {
  const seen = { steps: [] };
  const step = (name, extra = {}) => {
    seen.steps.push({ name, t: Date.now(), ...extra });
  };
  return { seen, step };
}

// Opens `url` in a fresh 1500×900 page, waits for JupyterLab, runs `drive(page)` and prints
// `seen` as one JSON line: `ok`, or the error with a failure.png screenshot in `shots`, the
// panel's text and whatever `onFailure(page)` adds; the page's console errors either way.
async function driveLab({ url, shots, seen, step, drive, onFailure = async () => {} }) {
  const browser = await launchBrowser();
  const page = await browser.newPage({ viewport: { width: 1500, height: 900 } });
  const consoleErrors = [];
  page.on('console', msg => {
    if (msg.type() === 'error') consoleErrors.push(msg.text());
  });
  try {
    await page.goto(url);
    await page.waitForFunction(() => window.jupyterapp && window.jupyterapp.shell, null, {
      timeout: 90000
    });
    step('lab loaded');
    await drive(page);
    seen.ok = true;
  } catch (error) {
    seen.ok = false;
    seen.error = String(error && error.stack ? error.stack : error);
    try {
      await page.screenshot({ path: path.join(shots, 'failure.png') });
      seen.panelText = await page.locator('#kcoral-panel').innerText({ timeout: 2000 });
      await onFailure(page);
    } catch {
      // best effort
    }
  } finally {
    seen.consoleErrors = consoleErrors.slice(0, 20);
    await browser.close();
  }
  process.stdout.write(JSON.stringify(seen) + '\n');
}

// Opens the KCoral panel and waits for its fleet table (a router's card).
async function showFleet(page) {
  await page.locator('#kcoral-status').waitFor({ timeout: 60000 });
  await page.evaluate(() => window.jupyterapp.commands.execute('kcoral:show-panel'));
  await page.locator('#kcoral-panel').waitFor({ state: 'visible', timeout: 30000 });
  await page.locator('#kcoral-panel .jp-KCoral-fleet').waitFor({ timeout: 60000 });
}

// A script's entry point: even a failure to start the browser ends in a JSON line.
function runLab(options) {
  driveLab(options).catch(error => {
    process.stdout.write(JSON.stringify({ ok: false, error: String(error) }) + '\n');
    process.exit(1);
  });
}

module.exports = {
  kernelIdle,
  launchBrowser,
  panelFit,
  widenPanel,
  recorder,
  runLab,
  showFleet
};
