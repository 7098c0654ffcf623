// Drives JupyterLab in headless Chromium for the sessions test of
// tests/labextension/test_browser.py: the panel lists two sessions of a KCoral server, and
// Stop ends the running one. Prints one JSON line with what it saw; the pytest side
// asserts. Environment: LAB_URL (with trailing slash), LAB_TOKEN, PLAYWRIGHT_CORE,
// SCREENSHOT_DIR, IDLE_SESSION and RUNNING_SESSION (the two session ids), ROGUE_SESSION (the
// id a rogue server sends, full of markup).
'use strict';

const path = require('path');
const { panelFit, recorder, runLab, widenPanel } = require('./lab_common.cjs');

const LAB_URL = process.env.LAB_URL;
const TOKEN = process.env.LAB_TOKEN;
const SHOTS = process.env.SCREENSHOT_DIR;
const IDLE = process.env.IDLE_SESSION;
const RUNNING = process.env.RUNNING_SESSION;
const ROGUE = process.env.ROGUE_SESSION;
const { seen, step } = recorder();

const card = id => `#kcoral-panel .jp-KCoral-session[data-session-id="${id}"]`;

// The text of each field of one session's card, as the user sees it (found by comparing
// ids, not by a selector: a rogue server's id is full of quotes).
async function readCard(page, id) {
  return page.evaluate(wanted => {
    const node = [...document.querySelectorAll('#kcoral-panel .jp-KCoral-session')].find(
      n => n.dataset.sessionId === wanted
    );
    const text = cls => node.querySelector(`.${cls}`)?.textContent ?? null;
    const stop = node.querySelector('button.jp-KCoral-stopSession');
    return {
      state: node.dataset.state,
      id: text('jp-KCoral-sessionId'),
      owner: text('jp-KCoral-sessionOwner'),
      gpu: text('jp-KCoral-sessionGpu'),
      memory: text('jp-KCoral-sessionMemory'),
      server: text('jp-KCoral-sessionServer'),
      stateText: text('jp-KCoral-sessionState'),
      title: node.title,
      stop: stop ? { text: stop.textContent, enabled: !stop.disabled } : null
    };
  }, id);
}

async function drive(page) {
  await page.locator('#kcoral-status').waitFor({ timeout: 60000 });
  await page.evaluate(() => window.jupyterapp.commands.execute('kcoral:show-panel'));
  const panel = page.locator('#kcoral-panel');
  await panel.waitFor({ state: 'visible', timeout: 30000 });
  await page.locator(card(RUNNING)).waitFor({ timeout: 60000 });
  await page.locator(card(IDLE)).waitFor({ timeout: 60000 });
  // The running session's job may still be starting when the panel first polls.
  await page.waitForFunction(
    selector => document.querySelector(selector)?.dataset.state === 'RUNNING',
    card(RUNNING),
    { timeout: 60000 }
  );
  step('sessions listed');
  seen.order = await page.evaluate(() =>
    [...document.querySelectorAll('#kcoral-panel .jp-KCoral-session')].map(
      n => n.dataset.sessionId
    )
  );
  await page.waitForFunction(
    wanted =>
      [...document.querySelectorAll('#kcoral-panel .jp-KCoral-session')].some(
        n => n.dataset.sessionId === wanted
      ),
    ROGUE,
    { timeout: 60000 }
  );
  seen.rogue = await readCard(page, ROGUE);
  seen.pwned = await page.evaluate(() => window.__kcoralPwned ?? null);
  seen.rogueServer = await page.evaluate(() => {
    const node = document.querySelector('#kcoral-panel .jp-KCoral-server[data-server="rogue"]');
    return node ? { state: node.dataset.state, text: node.textContent } : null;
  });
  seen.idle = await readCard(page, IDLE);
  seen.running = await readCard(page, RUNNING);
  seen.seats = await page.evaluate(() => {
    const terms = [...document.querySelectorAll('#kcoral-panel .jp-KCoral-facts dt')];
    return terms.find(dt => dt.textContent === 'sessions')?.nextElementSibling?.textContent;
  });
  seen.sessionsVisible = await page.locator('#kcoral-panel .jp-KCoral-sessions').isVisible();
  seen.fitNarrow = await panelFit(page);
  await page.screenshot({ path: path.join(SHOTS, 'sessions-narrow.png') });
  await widenPanel(page);
  await page.screenshot({ path: path.join(SHOTS, 'sessions.png') });

  await page.locator(`${card(RUNNING)} button.jp-KCoral-stopSession`).click();
  step('stop clicked');
  await page.waitForFunction(
    selector => document.querySelector(selector)?.dataset.state === 'ENDED',
    card(RUNNING),
    { timeout: 60000 }
  );
  seen.stopped = await readCard(page, RUNNING);
  seen.idleAfter = await readCard(page, IDLE);
  seen.note = await page.locator('#kcoral-panel .jp-KCoral-sessionNote').innerText();
  await page.waitForFunction(
    () => {
      const terms = [...document.querySelectorAll('#kcoral-panel .jp-KCoral-facts dt')];
      const seats = terms.find(dt => dt.textContent === 'sessions');
      return /^1\//.test(seats?.nextElementSibling?.textContent || '');
    },
    null,
    { timeout: 60000 }
  );
  seen.seatsAfter = await page.evaluate(() => {
    const terms = [...document.querySelectorAll('#kcoral-panel .jp-KCoral-facts dt')];
    return terms.find(dt => dt.textContent === 'sessions')?.nextElementSibling?.textContent;
  });
  step('session ended');
  await page.screenshot({ path: path.join(SHOTS, 'sessions-stopped.png') });
}

runLab({ url: `${LAB_URL}lab?token=${TOKEN}`, shots: SHOTS, seen, step, drive });
