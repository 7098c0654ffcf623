// Drives JupyterLab in headless Chromium for tests/labextension/test_browser_job_states.py:
// the jobs table and the output pane of a job that has its worker but waits for its GPUs,
// and of a failed job whose error holds a word longer than the panel is wide. Prints one
// JSON line with what it saw; the pytest side asserts. Environment: LAB_URL (with trailing
// slash), LAB_TOKEN, PLAYWRIGHT_CORE, SCREENSHOT_DIR, WAITING_JOB, FAILED_JOB (job ids).
'use strict';

const path = require('path');
const { panelFit, recorder, runLab, widenPanel } = require('./lab_common.cjs');

const SHOTS = process.env.SCREENSHOT_DIR;
const { seen, step } = recorder();

// The row of one job (its tooltip starts with its id), as a locator.
function jobRow(page, jobId) {
  return page.locator(`#kcoral-panel tr.jp-KCoral-job[title^="job ${jobId}"]`);
}

async function rowSeen(page, jobId) {
  return page.evaluate(id => {
    const row = [...document.querySelectorAll('#kcoral-panel tr.jp-KCoral-job')].find(tr =>
      tr.title.startsWith(`job ${id}`)
    );
    return row ? { cells: [...row.cells].map(td => td.textContent), title: row.title } : null;
  }, jobId);
}

async function paneSeen(page) {
  return page.evaluate(() => {
    const phase = document.querySelector('#kcoral-panel .jp-KCoral-phase');
    return {
      title: document.querySelector('#kcoral-panel .jp-KCoral-outputTitle')?.textContent ?? null,
      phase: phase?.textContent ?? null,
      phaseFits: phase ? phase.scrollWidth <= phase.clientWidth : null
    };
  });
}

async function drive(page) {
  await page.locator('#kcoral-status').waitFor({ timeout: 60000 });
  await page.evaluate(() => window.jupyterapp.commands.execute('kcoral:show-panel'));
  await page.locator('#kcoral-panel').waitFor({ state: 'visible', timeout: 30000 });
  const waiting = process.env.WAITING_JOB;
  const failed = process.env.FAILED_JOB;
  await page.waitForFunction(
    ids => {
      const titles = [...document.querySelectorAll('#kcoral-panel tr.jp-KCoral-job')].map(
        tr => tr.title
      );
      return ids.every(id => titles.some(title => title.startsWith(`job ${id}`)));
    },
    [waiting, failed],
    { timeout: 60000 }
  );
  step('jobs listed');
  seen.waitingRow = await rowSeen(page, waiting);
  await jobRow(page, waiting).click();
  await page.waitForFunction(
    id => document.querySelector('#kcoral-panel .jp-KCoral-outputTitle')?.textContent?.endsWith(
      id.slice(0, 8)
    ),
    waiting,
    { timeout: 30000 }
  );
  // Its live output has been read once the phase line says anything.
  await page.waitForFunction(
    () => document.querySelector('#kcoral-panel .jp-KCoral-phase')?.textContent,
    null,
    { timeout: 30000 }
  );
  await page.waitForTimeout(500); // what else its stream holds so far
  seen.waitingPane = await paneSeen(page);
  seen.waitingFit = await panelFit(page);
  await page.locator('#kcoral-panel').screenshot({ path: path.join(SHOTS, 'waiting-for-gpu.png') });
  await jobRow(page, failed).click();
  // The `finished: failed` line gets why the job failed once its result has been read.
  await page.waitForFunction(
    () => (document.querySelector('#kcoral-panel .jp-KCoral-phase')?.textContent || '').includes(
      'ValueError'
    ),
    null,
    { timeout: 30000 }
  );
  step('why shown');
  seen.failedPane = await paneSeen(page);
  seen.fitNarrow = await panelFit(page);
  await page.locator('#kcoral-panel').screenshot({ path: path.join(SHOTS, 'failed-long-error.png') });
  await widenPanel(page);
  await page.screenshot({ path: path.join(SHOTS, 'job-states.png') });
}

runLab({
  url: `${process.env.LAB_URL}lab?token=${process.env.LAB_TOKEN}`,
  shots: SHOTS,
  seen,
  step,
  drive
});
