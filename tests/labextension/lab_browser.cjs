// Drives JupyterLab in headless Chromium (playwright-core, Debian's /usr/bin/chromium) for
// tests/labextension/test_browser.py. Prints one JSON line with what it saw; the pytest side
// asserts. Environment: LAB_URL (with trailing slash), LAB_TOKEN, PLAYWRIGHT_CORE (module
// path), SCREENSHOT_DIR, NOTEBOOK (path below the Jupyter root).
'use strict';

const path = require('path');
const { kernelIdle, panelFit, recorder, runLab } = require('./lab_common.cjs');

const LAB_URL = process.env.LAB_URL;
const TOKEN = process.env.LAB_TOKEN;
const SHOTS = process.env.SCREENSHOT_DIR;
const NOTEBOOK = process.env.NOTEBOOK;
const { seen, step } = recorder();

async function runCell(page, index) {
  await page.evaluate(async i => {
    const app = window.jupyterapp;
    // The notebook, even when a click in the KCoral panel moved the focus there.
    const panel = [...app.shell.widgets('main')].find(w => w.sessionContext && w.content);
    app.shell.activateById(panel.id);
    panel.content.activeCellIndex = i;
    // Not awaited: the command resolves only when the cell has finished running.
    void app.commands.execute('notebook:run-cell');
  }, index);
}

// The notebook's kernel is idle (found among the main-area widgets: the focus may be in
// the side panel).
async function notebookKernelIdle(page) {
  await page.waitForFunction(
    () => {
      const w = [...window.jupyterapp.shell.widgets('main')].find(x => x.sessionContext);
      return w.sessionContext.session.kernel.status === 'idle';
    },
    null,
    { timeout: 60000 }
  );
}

async function drive(page) {
  // 1. A fresh install: no server configured and none started yet.
  const status = page.locator('#kcoral-status');
  await status.waitFor({ timeout: 60000 });
  const statusMatches = async pattern => {
    await page.waitForFunction(
      source => new RegExp(source).test(
        document.querySelector('#kcoral-status')?.getAttribute('aria-label') || ''
      ),
      pattern.source,
      { timeout: 90000 }
    );
    return status.getAttribute('aria-label');
  };
  seen.statusBeforeFirstCell = await statusMatches(/no server yet/);
  seen.statusVisibleBefore = (await status.innerText()).replace(/\s+/g, ' ').trim();
  step('status before the first cell', { text: seen.statusBeforeFirstCell });

  // Wait for the kernel, then load the magics (cell 0).
  await kernelIdle(page);
  await runCell(page, 0);
  await page.waitForFunction(
    () => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle',
    null,
    { timeout: 30000 }
  );

  // 2. Clicking the status bar item opens the panel.
  await status.click();
  const panel = page.locator('#kcoral-panel');
  await panel.waitFor({ state: 'visible', timeout: 30000 });
  seen.panelOpenedByClick = true;
  step('panel open');
  // The panel stays at JupyterLab's default side-bar width: what a fresh install shows, and
  // what the screenshots show (issue 29.4: it must fit there).

  // 3. A %%kcoral cell that prints for a few seconds; its job shows live output. It starts
  // the kernel's embedded server (one worker), which the status bar then shows.
  await runCell(page, 1);
  step('cell 1 started');
  seen.statusText = await statusMatches(/KCoral ● cpu · \d+\/1 busy · \d+ queued/);
  seen.statusVisibleText = (await status.innerText()).replace(/\s+/g, ' ').trim();
  step('status shows the embedded server', { text: seen.statusText });
  const firstRow = panel.locator('tr.jp-KCoral-job').first();
  await firstRow.waitFor({ timeout: 60000 });
  seen.firstJobId = await firstRow.getAttribute('data-job-id');
  seen.firstJobStatusAtSelect = await firstRow.getAttribute('data-status');
  await firstRow.click();
  const output = panel.locator('pre.jp-KCoral-outputText');
  await page.waitForFunction(
    () => /tick 0/.test(document.querySelector('#kcoral-panel pre.jp-KCoral-outputText')?.textContent || ''),
    null,
    { timeout: 60000 }
  );
  const early = await output.innerText();
  seen.outputMidRun = !/tick 9/.test(early);
  step('first output', { output: early });
  await page.screenshot({ path: path.join(SHOTS, 'panel.png') });
  await page.waitForFunction(
    () => /tick 9/.test(document.querySelector('#kcoral-panel pre.jp-KCoral-outputText')?.textContent || ''),
    null,
    { timeout: 60000 }
  );
  seen.firstOutput = await output.innerText();
  await page.waitForFunction(
    id => document.querySelector(`#kcoral-panel tr[data-job-id="${id}"]`)?.dataset.status === 'COMPLETED',
    seen.firstJobId,
    { timeout: 60000 }
  );
  seen.firstJobFinalStatus = 'COMPLETED';
  seen.firstJobCells = await page.evaluate(
    id => [...document.querySelector(`#kcoral-panel tr[data-job-id="${id}"]`).cells].map(
      c => c.textContent
    ),
    seen.firstJobId
  );
  seen.fitOneServer = await panelFit(page);
  seen.embeddedServer = await page.evaluate(() => {
    const card = document.querySelector('#kcoral-panel .jp-KCoral-server');
    return {
      name: card?.dataset.server,
      label: card?.querySelector('.jp-KCoral-serverName')?.textContent.trim(),
      url: card?.querySelector('.jp-KCoral-serverUrl')?.textContent,
      facts: [...(card?.querySelectorAll('.jp-KCoral-facts dt') ?? [])].map(dt => [
        dt.textContent,
        dt.nextElementSibling?.textContent
      ])
    };
  });
  step('first job completed');
  await status.screenshot({ path: path.join(SHOTS, 'statusbar.png') });

  // 4. A second, long-running job is cancelled from the panel.
  await runCell(page, 2);
  await page.waitForFunction(
    first => {
      const row = document.querySelector('#kcoral-panel tr.jp-KCoral-job');
      return row && row.dataset.jobId !== first && row.dataset.status === 'RUNNING';
    },
    seen.firstJobId,
    { timeout: 60000 }
  );
  const secondRow = panel.locator('tr.jp-KCoral-job').first();
  seen.secondJobId = await secondRow.getAttribute('data-job-id');
  await secondRow.click();
  await page.waitForFunction(
    () => /long job started/.test(document.querySelector('#kcoral-panel pre.jp-KCoral-outputText')?.textContent || ''),
    null,
    { timeout: 60000 }
  );
  seen.busyStatusText = await status.getAttribute('aria-label');
  // What the pane says the job does: the cell's own words, as its status line says them.
  seen.secondJobPhase = await panel.locator('.jp-KCoral-phase').innerText();
  seen.secondOutputFit = await output.evaluate(pre => ({
    scrollWidth: pre.scrollWidth,
    clientWidth: pre.clientWidth
  }));
  await page.screenshot({ path: path.join(SHOTS, 'panel-running.png') });
  const cancel = panel.locator('button.jp-KCoral-cancel');
  seen.cancelEnabled = await cancel.isEnabled();
  await cancel.click();
  step('cancel clicked');
  await page.waitForFunction(
    id => document.querySelector(`#kcoral-panel tr[data-job-id="${id}"]`)?.dataset.status === 'CANCELLED',
    seen.secondJobId,
    { timeout: 60000 }
  );
  seen.secondJobFinalStatus = 'CANCELLED';
  seen.cancelEnabledAfter = await cancel.isEnabled();
  step('second job cancelled');
  await page.screenshot({ path: path.join(SHOTS, 'panel-cancelled.png') });

  // 5. `%kcoral connect URL` (a server with two workers): the status bar follows. Sent once
  // the cancelled cell has ended: a request queued behind a failing cell would be aborted.
  await notebookKernelIdle(page);
  await runCell(page, 3);
  seen.statusAfterConnect = await statusMatches(/KCoral ● cpu · \d+\/2 busy · \d+ queued/);
  step('status follows the connection', { text: seen.statusAfterConnect });

  // 6. A job on that second server: the jobs table says which server each job ran on.
  await runCell(page, 4);
  await page.waitForFunction(
    () => document.querySelectorAll('#kcoral-panel tr.jp-KCoral-jobServer').length === 2 &&
      document.querySelector('#kcoral-panel tr.jp-KCoral-job')?.dataset.status === 'COMPLETED',
    null,
    { timeout: 90000 }
  );
  seen.jobServerHeadings = await page.evaluate(() =>
    [...document.querySelectorAll('#kcoral-panel tr.jp-KCoral-jobServer')].map(r => r.textContent)
  );
  seen.serverLabels = await page.evaluate(() =>
    [...document.querySelectorAll('#kcoral-panel .jp-KCoral-server')].map(card => [
      card.dataset.server,
      card.querySelector('.jp-KCoral-serverName')?.textContent.trim()
    ])
  );
  seen.fitTwoServers = await panelFit(page);
  await page.screenshot({ path: path.join(SHOTS, 'panel-two-servers.png') });
  step('jobs of two servers');

  // 8. A cell still running on that server when the kernel restarts: nothing will update
  // its status line again, so the extension rewrites it to say the kernel restarted.
  await notebookKernelIdle(page);
  await runCell(page, 5);
  const cellText = () => document.querySelectorAll('.jp-Notebook .jp-Cell')[5]?.innerText || '';
  await page.waitForFunction(
    () => /waiting for a restart/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[5]?.innerText || '') &&
      /kcoral: running/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[5]?.innerText || ''),
    null,
    { timeout: 60000 }
  );
  step('cell running before the restart');
  await page.evaluate(() => {
    const w = [...window.jupyterapp.shell.widgets('main')].find(x => x.sessionContext);
    return w.sessionContext.session.kernel.restart();
  });
  await page.waitForFunction(
    () => /the kernel restarted while this cell ran/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[5]?.innerText || ''),
    null,
    { timeout: 60000 }
  );
  seen.lineAfterRestart = await page.evaluate(cellText);
  step('status line after the restart', { text: seen.lineAfterRestart });
  await page.locator('.jp-Notebook .jp-Cell').nth(5).screenshot({
    path: path.join(SHOTS, 'cell-after-restart.png')
  });

  // 9. The palette commands exist.
  seen.commands = await page.evaluate(() =>
    ['kcoral:show-panel', 'kcoral:cancel-job'].map(id => [
      id,
      window.jupyterapp.commands.hasCommand(id),
      window.jupyterapp.commands.label(id)
    ])
  );
}

runLab({
  url: `${LAB_URL}lab/tree/${NOTEBOOK}?token=${TOKEN}`,
  shots: SHOTS,
  seen,
  step,
  drive,
  onFailure: async page => {
    seen.cellTexts = await page.evaluate(() =>
      [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map(c => c.innerText.slice(-600))
    );
  }
});
