// What the browser scripts of tests/labextension share: Debian's headless Chromium through
// playwright-core (PLAYWRIGHT_CORE: the module path; nothing downloads a browser), and a
// wider KCoral panel for readable screenshots.
'use strict';

const { chromium } = require(process.env.PLAYWRIGHT_CORE);

function launchBrowser() {
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
      '--disable-dev-shm-usage'
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

module.exports = { launchBrowser, widenPanel };
