// Drives JupyterLab in headless Chromium for tests/labextension/test_browser.py: with a
// configured KCoral server that refuses the token configured for it, prints (one JSON
// line) what the status bar and that server's card in the KCoral panel say once the
// panel shows the refusal. Environment: LAB_URL (with trailing slash), LAB_TOKEN,
// PLAYWRIGHT_CORE, SCREENSHOT_DIR.
'use strict';

const path = require('path');
const { recorder, runLab } = require('./lab_common.cjs');

const { seen, step } = recorder();

async function drive(page) {
  await page.locator('#kcoral-status').waitFor({ timeout: 60000 });
  await page.evaluate(() => window.jupyterapp.commands.execute('kcoral:show-panel'));
  await page.waitForFunction(
    () => /refused the token/.test(
      document.querySelector('#kcoral-panel .jp-KCoral-serverError')?.textContent || ''
    ),
    null,
    { timeout: 60000 }
  );
  step('the panel shows the refusal');
  Object.assign(
    seen,
    await page.evaluate(() => {
      const status = document.querySelector('#kcoral-status');
      const card = document.querySelector('#kcoral-panel .jp-KCoral-server');
      const colour = node => getComputedStyle(node.querySelector('.jp-KCoral-dot')).color;
      return {
        status: status.getAttribute('aria-label'),
        statusTitle: status.title,
        statusState: status.dataset.state,
        statusDot: colour(status),
        cardState: card.dataset.state,
        cardDot: colour(card),
        cardError: card.querySelector('.jp-KCoral-serverError').textContent
      };
    })
  );
  await page.screenshot({ path: path.join(process.env.SCREENSHOT_DIR, 'token-refused.png') });
}

runLab({
  url: `${process.env.LAB_URL}lab?token=${process.env.LAB_TOKEN}`,
  shots: process.env.SCREENSHOT_DIR,
  seen,
  step,
  drive
});
