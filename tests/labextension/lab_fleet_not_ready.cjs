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
  // A 250 px side panel broke the kind mid-word (`gpu=c` over `pu`). At that width, with
  // the longest kinds and labels a fleet names beside it (rows copied from the real one,
  // laid out by the real style), a name's lines break only after a space or a hyphen.
  seen.narrowNames = await page.evaluate(() => {
    const panel = document.querySelector('#kcoral-panel');
    panel.style.width = '250px';
    const body = panel.querySelector('.jp-KCoral-fleet tbody');
    for (const name of ['gpu=a100-sxm4-80gb ×8', 'arch=sm_90', 'gpu=cpu (default)']) {
      const row = body.rows[0].cloneNode(true);
      row.cells[0].textContent = name;
      body.append(row);
    }
    // Each line of a name cell: where a character's box starts lower than the one before it.
    const lines = cell => {
      const text = cell.firstChild;
      const out = [''];
      let top = null;
      for (let i = 0; i < text.length; i++) {
        const range = document.createRange();
        range.setStart(text, i);
        range.setEnd(text, i + 1);
        const box = range.getClientRects()[0];
        if (box && top !== null && box.top > top + 2) {
          out.push('');
        }
        top = box ? box.top : top;
        out[out.length - 1] += text.data[i];
      }
      return out;
    };
    return {
      panelWidth: panel.getBoundingClientRect().width,
      names: [...body.rows].map(row => lines(row.cells[0]))
    };
  });
  // The not-ready parts (`· 1 unhealthy`) widen the nodes column: beside them the panel fits
  // `gpu=cpu`; the longest names fit where every node of the fleet is ready.
  await page.evaluate(() => {
    const body = document.querySelector('#kcoral-panel .jp-KCoral-fleet tbody');
    body.rows[1].remove();
    body.rows[1].remove();
  });
  seen.fit250 = await panelFit(page);
  await page.evaluate(() => {
    const body = document.querySelector('#kcoral-panel .jp-KCoral-fleet tbody');
    for (const name of ['gpu=a100-sxm4-80gb ×8', 'arch=sm_90']) {
      const row = body.rows[0].cloneNode(true);
      row.cells[0].textContent = name;
      body.append(row);
    }
    for (const row of body.rows) {
      row.cells[1].textContent = '2';
    }
  });
  seen.fit250AllReady = await panelFit(page);
  await page.locator('#kcoral-panel').screenshot({ path: path.join(SHOTS, 'fleet-250px.png') });
}

runLab({ url: `${LAB_URL}lab?token=${TOKEN}`, shots: SHOTS, seen, step, drive });
