// Drives JupyterLab in headless Chromium for the fleet test of
// tests/labextension/test_browser.py: the panel's card of a KCoral router shows its fleet
// (kinds and labels with nodes, free seats, queue, estimated wait) while a program holds
// the default kind's only seat and another waits. Prints one JSON line with what it saw;
// the pytest side asserts. Environment: LAB_URL (with trailing slash), LAB_TOKEN,
// PLAYWRIGHT_CORE, SCREENSHOT_DIR.
'use strict';

const path = require('path');
const { panelFit, recorder, runLab, showFleet, widenPanel } = require('./lab_common.cjs');

const LAB_URL = process.env.LAB_URL;
const TOKEN = process.env.LAB_TOKEN;
const SHOTS = process.env.SCREENSHOT_DIR;
const { seen, step } = recorder();

// The fleet table as the user sees it: each row's cells, tooltip and whether it is bold
// (the default kind), and whether any cell but the first is cut short.
async function readFleet(page) {
  return page.evaluate(() => {
    const table = document.querySelector('#kcoral-panel .jp-KCoral-fleet');
    if (!table) return null;
    const rows = [...table.querySelectorAll('tbody tr')].map(tr => ({
      cells: [...tr.cells].map(td => td.textContent),
      title: tr.title,
      bold: getComputedStyle(tr.cells[0]).fontWeight === '700'
    }));
    const header = [...table.querySelectorAll('th')].map(th => th.textContent);
    const cut = [...table.querySelectorAll('th, td')]
      .filter(c => c.cellIndex !== 0 && c.scrollWidth > c.clientWidth)
      .map(c => c.textContent);
    return { header, rows, cut };
  });
}

async function drive(page) {
  await showFleet(page);
  step('fleet shown');
  // The pytest side holds the default kind's only seat and queues one more request.
  await page.waitForFunction(
    () => {
      const row = document.querySelector('#kcoral-panel .jp-KCoral-fleet tbody tr');
      const cells = row ? [...row.cells].map(td => td.textContent) : [];
      return cells[3] === '1' && cells[4] !== '–';
    },
    null,
    { timeout: 90000 }
  );
  step('queue shown');
  seen.fleet = await readFleet(page);
  seen.fitNarrow = await panelFit(page);
  // The panel, not the table: the table is rebuilt at every poll (once a second here).
  await page.locator('#kcoral-panel').screenshot({ path: path.join(SHOTS, 'fleet-narrow.png') });
  await widenPanel(page);
  await page.screenshot({ path: path.join(SHOTS, 'fleet.png') });
}

runLab({ url: `${LAB_URL}lab?token=${TOKEN}`, shots: SHOTS, seen, step, drive });
