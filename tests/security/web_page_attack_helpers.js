// What the attack pages (web_page_attack*.html) share: how a request, an event or an element
// ended, as the page sees it.
'use strict';

// A fetch: 'read <status> <text>', 'opaque' (sent, nothing readable) or 'failed'.
function outcome(request) {
  return request.then(
    r => (r.type === 'opaque' ? 'opaque' : r.text().then(t => `read ${r.status} ${t.slice(0, 200)}`)),
    () => 'failed');
}

// The first value `start` hands its callback, or 'timeout' after 8 s.
function event(start) {
  return new Promise(done => { start(done); setTimeout(() => done('timeout'), 8000); });
}

// A <script>, <img> or <iframe> of `url`: 'load' or 'error'.
function element(tag, url) {
  return event(done => {
    const node = document.createElement(tag);
    node.onload = () => done('load');
    node.onerror = () => done('error');
    node.src = url;
    document.body.appendChild(node);
  });
}
