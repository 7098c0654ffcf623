// Drives headless Chromium (lab_common.launchBrowser) for
// test_web_page_attacks_on_jupyter_in_chromium.py: the user logs in to JupyterLab at
// LAB_URL (its token once: the browser keeps Jupyter's login cookie), then opens each page
// of PAGE_URLS (space-separated: the attacker's, on another site or another port of the
// same host) in another tab of the same browser. Prints one JSON line: per page, what it
// saw (`report`) and what each frame it opened shows (`frames`).
'use strict';

const { launchBrowser } = require('../labextension/lab_common.cjs');

async function main() {
  const browser = await launchBrowser([
    '--host-resolver-rules=MAP evil.example 127.0.0.1',
    '--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessRespectPreflightResults'
  ]);
  try {
    const context = await browser.newContext();
    const login = await context.newPage();
    // the login cookie without JupyterLab's own page (whose panel would call the routes)
    await login.goto(`${process.env.LAB_URL}api/status?token=${process.env.LAB_TOKEN}`);
    const pages = {};
    for (const url of process.env.PAGE_URLS.split(' ')) {
      const page = await context.newPage();
      await page.goto(url);
      await page.waitForFunction(() => window.report, null, { timeout: 120000 });
      const frames = [];
      for (const frame of page.frames().slice(1)) {
        frames.push(frame.url());
      }
      pages[new URL(url).host] = { report: await page.evaluate(() => window.report), frames };
    }
    const cookies = (await context.cookies()).map(cookie => cookie.name);
    console.log(JSON.stringify({ pages, cookies }));
  } finally {
    await browser.close();
  }
}

main().catch(error => {
  console.log(JSON.stringify({ error: String(error.stack || error) }));
  process.exitCode = 1;
});
