// Drives Debian's headless Chromium (playwright-core from PLAYWRIGHT_CORE; nothing downloads
// a browser) through web_page_attack.html for test_web_page_attacks_in_chromium.py, and
// prints one JSON line: what the page saw (`report`), what each frame it opened shows
// (`frames`: a refused frame is Chromium's error page), then, as the user, the target's
// /v1/info typed into the address bar (`typed`) and reached through the page's link
// (`followed`).
//
// evil.example and rebound.example resolve to 127.0.0.1 (--host-resolver-rules): a page at
// http://evil.example:PORT is another site's. REBOUND=1 plays DNS rebinding: the page is
// served under the target's own port and name (PAGE_URL), so the target is its own origin.
'use strict';

const fs = require('fs');
const path = require('path');
const { launchBrowser } = require('../labextension/lab_common.cjs');

// what the attacker's server would send for a path of the rebound page
const SERVED = {
  '/web_page_attack.html': ['text/html', 'web_page_attack.html'],
  '/web_page_attack_helpers.js': ['text/javascript', 'web_page_attack_helpers.js']
};

async function main() {
  const browser = await launchBrowser([
    '--host-resolver-rules=MAP evil.example 127.0.0.1, MAP rebound.example 127.0.0.1',
    // Chromium's own guard (a public page's requests to loopback need the user's consent)
    // off: other browsers have none, and the server's checks are what is tested here
    '--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessRespectPreflightResults'
  ]);
  try {
    const page = await browser.newPage();
    const pageUrl = new URL(process.env.PAGE_URL);
    const rebound = url => url.host === pageUrl.host && url.pathname in SERVED;
    if (process.env.REBOUND === '1') {
      // the rebound name still points at the attacker's server for the page and its script
      await page.route(rebound, route => {
        const [contentType, name] = SERVED[new URL(route.request().url()).pathname];
        const body = fs.readFileSync(path.join(__dirname, name), 'utf8');
        return route.fulfill({ contentType, body });
      });
    }
    // every answer the target gave the page's requests, as the browser saw it (a page
    // cannot read the status of its scripts, images or no-cors requests; Playwright can)
    const target = new URL(process.env.TARGET);
    const answers = [];
    const record = response => {
      const url = new URL(response.url());
      const attackers = process.env.REBOUND === '1' && url.pathname in SERVED;
      if (url.host === target.host && !attackers) {
        const type = response.request().resourceType();
        answers.push({ url: url.pathname, status: response.status(), type });
      }
    };
    page.on('response', record);
    await page.goto(pageUrl.href);
    // the page's own requests then go to the target as sent (a route would carry them all
    // through Playwright, the page's 128 MiB body included)
    await page.unrouteAll();
    await page.waitForFunction(() => window.report, null, { timeout: 120000 });
    const report = await page.evaluate(() => window.report);
    page.off('response', record);
    const frames = [];
    for (const frame of page.frames().slice(1)) {
      if (frame.url().startsWith('about:')) {
        continue;
      }
      let text = '';
      try {
        text = await frame.evaluate(() => document.body.innerText.slice(0, 200));
      } catch (error) {
        text = `(unreadable: ${error.message.split('\n')[0]})`;
      }
      frames.push({ url: frame.url(), text });
    }
    await page.click('#link');
    await page.waitForURL(url => url.pathname === '/v1/info', { timeout: 30000 });
    const followed = await page.evaluate(() => document.body.innerText.slice(0, 200));
    await page.goto(new URL('/v1/info', target).href);
    const typed = await page.evaluate(() => document.body.innerText.slice(0, 200));
    console.log(JSON.stringify({ report, answers, frames, followed, typed }));
  } finally {
    await browser.close();
  }
}

main().catch(error => {
  console.log(JSON.stringify({ error: String(error.stack || error) }));
  process.exitCode = 1;
});
