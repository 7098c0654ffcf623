// Drives JupyterLab in headless Chromium for
// tests/labextension/test_browser_fleet_not_ready.py: the panel's fleet table of a router
// one of whose two nodes has stopped says so beside the ready count ("1/2 ready · 1
// unhealthy"). Prints one JSON line with what it saw; the pytest side asserts.
// Environment: LAB_URL (with trailing slash), LAB_TOKEN, PLAYWRIGHT_CORE, SCREENSHOT_DIR.
'use strict';

const path = require('path');
const { panelFit, recorder, runLab, showFleet } = require('./lab_common.cjs');

const LAB_URL = process.env.LAB_URL;
const TOKEN = process.env.LAB_TOKEN;
const SHOTS = process.env.SCREENSHOT_DIR;
const { seen, step } = recorder();

async function drive(page) {
  await showFleet(page);
  step('fleet shown');
  // The pytest side has stopped one node: the row says it once the router reads it stale.
  await page.waitForFunction(
    () => {
      const row = document.querySelector('#kcoral-panel .jp-KCoral-fleet tbody tr');
      return row !== null && row.cells[1].textContent.includes('unhealthy');
    },
    null,
    { timeout: 90000 }
  );
  step('the stopped node shown');
  seen.rows = await page.evaluate(() =>
    [...document.querySelectorAll('#kcoral-panel .jp-KCoral-fleet tbody tr')].map(tr =>
      [...tr.cells].map(td => td.textContent)
    )
  );
  seen.fitNarrow = await panelFit(page);
  await page.locator('#kcoral-panel').screenshot({ path: path.join(SHOTS, 'fleet-not-ready.png') });
}

runLab({ url: `${LAB_URL}lab?token=${TOKEN}`, shots: SHOTS, seen, step, drive });
