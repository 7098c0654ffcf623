// Drives JupyterLab in headless Chromium for the quickstart test of
// tests/labextension/test_browser.py (issue 29.1): opens NOTEBOOK in a fresh JupyterLab,
// runs Run All as a person would (the notebook:run-all-cells command, the menu's Run All
// Cells), waits until every code cell has run and prints, as one JSON line, each cell's
// tags, execution count and outputs as the notebook model holds them. The pytest side
// asserts. Environment: LAB_URL (with trailing slash), LAB_TOKEN, PLAYWRIGHT_CORE,
// SCREENSHOT_DIR, NOTEBOOK (path below the Jupyter root).
'use strict';

const path = require('path');
const { kernelIdle, recorder, runLab } = require('./lab_common.cjs');

const LAB_URL = process.env.LAB_URL;
const TOKEN = process.env.LAB_TOKEN;
const SHOTS = process.env.SCREENSHOT_DIR;
const NOTEBOOK = process.env.NOTEBOOK;
const { seen, step } = recorder();

function cellsOf() {
  const app = window.jupyterapp;
  const panel = [...app.shell.widgets('main')].find(w => w.sessionContext && w.content);
  return panel.content.widgets.map(cell => cell.model.toJSON());
}

async function drive(page) {
  await kernelIdle(page);
  step('kernel idle');
  await page.evaluate(() => {
    // Not awaited: it resolves only when the last cell has run.
    void window.jupyterapp.commands.execute('notebook:run-all-cells');
  });
  step('run all');
  // Done when every code cell has run, or when no code cell waits or runs ('[*]') and the
  // kernel is idle, and stays so for 3 s: between two cells the kernel is idle a moment and
  // a cell not yet sent shows '[ ]', not '[*]' (a run under load was read there as stopped
  // before its last cells). A cell the kernel aborted after an error is left with no count:
  // the pytest side reads that as "Run All stopped there".
  await page.waitForFunction(
    () => {
      const w = [...window.jupyterapp.shell.widgets('main')].find(x => x.sessionContext);
      const cells = w.content.widgets.filter(c => c.model.type === 'code');
      const prompts = cells.map(c => c.node.querySelector('.jp-InputPrompt')?.textContent ?? '');
      const settled =
        w.sessionContext.session.kernel.status === 'idle' &&
        cells.some(c => c.model.executionCount !== null) &&
        !prompts.some(p => p.includes('*'));
      if (!settled) {
        window.kcoralSettledSince = undefined;
        return false;
      }
      if (cells.every(c => c.model.executionCount !== null)) {
        return true;
      }
      window.kcoralSettledSince = window.kcoralSettledSince ?? Date.now();
      return Date.now() - window.kcoralSettledSince >= 3000;
    },
    null,
    { timeout: 240000, polling: 500 }
  );
  step('run all ended');
  seen.cells = await page.evaluate(cellsOf);
  await page.screenshot({ path: path.join(SHOTS, 'quickstart-run-all.png') });
}

runLab({
  url: `${LAB_URL}lab/tree/${NOTEBOOK}?token=${TOKEN}`,
  shots: SHOTS,
  seen,
  step,
  drive,
  onFailure: async page => {
    try {
      seen.cells = await page.evaluate(cellsOf);
    } catch {
      // best effort
    }
  }
});
