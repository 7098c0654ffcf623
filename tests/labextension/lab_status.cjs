// Drives JupyterLab in headless Chromium for tests/labextension/test_browser.py: opens
// JupyterLab without a notebook, waits until the KCoral status bar item's text matches
// STATUS_PATTERN (a regular expression), opens the KCoral panel and prints (one JSON line)
// what the status bar says (text, tooltip, state, the colour of its dot, where its text
// sits beside JupyterLab's own status text), the first server card (state, dot colour,
// error) and the panel's notes. Environment: LAB_URL (with trailing slash), LAB_TOKEN,
// PLAYWRIGHT_CORE, SCREENSHOT_DIR, STATUS_PATTERN, SHOT (the screenshot's file name).
'use strict';

const path = require('path');
const { recorder, runLab } = require('./lab_common.cjs');

const { seen, step } = recorder();

async function drive(page) {
  await page.locator('#kcoral-status').waitFor({ timeout: 60000 });
  await page.waitForFunction(
    pattern => new RegExp(pattern).test(
      document.querySelector('#kcoral-status')?.getAttribute('aria-label') || ''
    ),
    process.env.STATUS_PATTERN,
    { timeout: 60000 }
  );
  await page.evaluate(() => window.jupyterapp.commands.execute('kcoral:show-panel'));
  await page.locator('#kcoral-panel').waitFor({ state: 'visible', timeout: 30000 });
  step('status shown');
  Object.assign(
    seen,
    await page.evaluate(() => {
      const status = document.querySelector('#kcoral-status');
      const card = document.querySelector('#kcoral-panel .jp-KCoral-server');
      const colour = node => getComputedStyle(node.querySelector('.jp-KCoral-dot')).color;
      const box = node => {
        const rect = node.getBoundingClientRect();
        return [Math.round(rect.top), Math.round(rect.bottom)];
      };
      // JupyterLab's own status text (the running kernels' count is always there).
      const theirs = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem')]
        .filter(node => !status.contains(node) && node.getClientRects().length);
      return {
        status: status.getAttribute('aria-label'),
        statusTitle: status.title,
        statusState: status.dataset.state,
        statusDot: colour(status),
        statusTextBox: box(status.querySelector('.jp-KCoral-statusText')),
        labTextBox: theirs.length ? box(theirs[0]) : null,
        cardState: card?.dataset.state ?? null,
        cardDot: card ? colour(card) : null,
        cardError: card?.querySelector('.jp-KCoral-serverError')?.textContent ?? null,
        notes: [...document.querySelectorAll('#kcoral-panel .jp-KCoral-note')]
          .map(node => node.textContent)
          .filter(text => text)
      };
    })
  );
  await page.screenshot({ path: path.join(process.env.SCREENSHOT_DIR, process.env.SHOT) });
}

runLab({
  url: `${process.env.LAB_URL}lab?token=${process.env.LAB_TOKEN}`,
  shots: process.env.SCREENSHOT_DIR,
  seen,
  step,
  drive
});
