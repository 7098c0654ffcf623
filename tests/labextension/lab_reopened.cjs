// Drives JupyterLab in headless Chromium for tests/labextension/test_browser.py: opens
// NOTEBOOK, saved while a %%kcoral cell ran (its status line's metadata says `live`), and
// prints, as one JSON line, the first cell's outputs once the extension has settled that
// line (the kernel's updates never reach a new view, so it would say `running` for good),
// and the KCoral panel's jobs note (a configured server there does not answer).
// Environment: LAB_URL (with trailing slash), LAB_TOKEN, PLAYWRIGHT_CORE, SCREENSHOT_DIR,
// NOTEBOOK (path below the Jupyter root).
'use strict';

const path = require('path');
const { kernelIdle, recorder, runLab } = require('./lab_common.cjs');

const { seen, step } = recorder();

function outputsOf() {
  const app = window.jupyterapp;
  const panel = [...app.shell.widgets('main')].find(w => w.sessionContext && w.content);
  return panel ? panel.content.widgets[0].model.toJSON().outputs : null;
}

async function drive(page) {
  await kernelIdle(page);
  step('kernel idle');
  await page.waitForFunction(
    () => {
      const panel = [...window.jupyterapp.shell.widgets('main')].find(w => w.content);
      const text = panel?.content.widgets[0]?.node.textContent ?? '';
      return text.includes('kcoral: \u26a0');
    },
    null,
    { timeout: 60000, polling: 200 }
  );
  step('line settled');
  seen.outputs = await page.evaluate(outputsOf);
  seen.shownText = await page.evaluate(() => {
    const panel = [...window.jupyterapp.shell.widgets('main')].find(w => w.content);
    return panel.content.widgets[0].node.querySelector('.jp-OutputArea').textContent;
  });
  await page.screenshot({ path: path.join(process.env.SCREENSHOT_DIR, 'reopened-line.png') });
  // The panel's jobs note (under its Jobs heading), with a configured server that nothing
  // answers at.
  await page.evaluate(() => window.jupyterapp.commands.execute('kcoral:show-panel'));
  const jobsNote =
    "[...document.querySelectorAll('#kcoral-panel h3')]" +
    ".find(h => h.textContent === 'Jobs')?.nextElementSibling?.textContent || ''";
  await page.waitForFunction(`/not running/.test(${jobsNote})`, null, { timeout: 60000 });
  seen.jobsNote = await page.evaluate(jobsNote);
}

runLab({
  url: `${process.env.LAB_URL}lab/tree/${process.env.NOTEBOOK}?token=${process.env.LAB_TOKEN}`,
  shots: process.env.SCREENSHOT_DIR,
  seen,
  step,
  drive,
  onFailure: async page => {
    try {
      seen.outputs = await page.evaluate(outputsOf);
    } catch {
      // best effort
    }
  }
});
