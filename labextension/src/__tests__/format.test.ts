import { ApiError, IServerEntry } from '../api';
import {
  describePhase,
  formatMs,
  isCancellable,
  newestFirst,
  sandboxText,
  statusText,
  statusTitle,
  summarize,
  unreachedKind
} from '../format';
import { health } from './helpers';

const entry = (arch?: string): IServerEntry => ({
  name: 'gpu',
  url: 'http://127.0.0.1:8000',
  auth: false,
  health: health(1, 2, 0, arch),
  info: { kcoral: '0.1.0', protocol: 1, features: [], device: arch ? 'gpu' : 'cpu' },
  features: [],
  reachable: true
});

describe('status text', () => {
  it('names the target, the busy workers and the queue', () => {
    expect(statusText(summarize([entry('sm_90a')], ''))).toBe(
      'KCoral ● sm_90a · 1/2 busy · 0 queued'
    );
    expect(statusText(summarize([entry()], ''))).toBe('KCoral ● cpu · 1/2 busy · 0 queued');
  });

  it('says no worker is ready, not 1/0 busy, while a server shuts down (capacity 0)', () => {
    // A soak: a server stopped while it ran a program drains for up to its deadline,
    // /health answering capacity 0 (PROTOCOL §12) and new programs 503 "shutting down";
    // the status bar said `KCoral ● cpu · 1/0 busy · 0 queued` all along.
    const draining = { ...entry(), health: health(1, 0, 0) };
    expect(statusText(summarize([draining], ''))).toBe(
      'KCoral ● cpu · no worker ready · 1 busy · 0 queued'
    );
    expect(statusTitle(summarize([draining], ''))).toMatch(/shutting down/);
    expect(statusTitle(summarize([entry()], ''))).not.toMatch(/shutting down/);
  });

  it('says when programs run without a sandbox, and only then', () => {
    const unconfined = { ...entry(), info: { ...entry().info!, sandbox: 'none' } };
    const confined = { ...entry(), info: { ...entry().info!, sandbox: 'bubblewrap' } };
    expect(statusText(summarize([unconfined], ''))).toBe(
      'KCoral ● cpu · 1/2 busy · 0 queued · no sandbox'
    );
    expect(statusText(summarize([confined], ''))).toBe('KCoral ● cpu · 1/2 busy · 0 queued');
    expect(statusTitle(summarize([unconfined], ''))).toMatch(/without a sandbox/);
    expect(statusTitle(summarize([confined], ''))).toMatch(/sandboxed \(bubblewrap\)/);
    expect(sandboxText(undefined)).toBe('');
  });

  it('says a server refuses the token, not that it is ready, when only /health answers', () => {
    // A soak: KCORAL_URL with a wrong KCORAL_TOKEN. /health answers anyone (PROTOCOL §12),
    // so the status bar showed a green `KCoral ● cpu · 0/2 busy · 0 queued` while the
    // server refused every cell, job and session from this Jupyter server.
    const refused = { ...entry(), error: 'refused the token configured for it (HTTP 401)' };
    expect(statusText(summarize([refused], ''))).toBe('KCoral ● cpu · token refused');
    expect(statusTitle(summarize([refused], ''))).toBe(
      'KCoral server gpu: refused the token configured for it (HTTP 401). ' +
        'Click to open the KCoral panel.'
    );
    const tokenless = { ...entry(), error: 'needs a token: set one for this server (HTTP 401)' };
    expect(statusText(summarize([tokenless], ''))).toBe('KCoral ● cpu · needs a token');
    const forbidden = { ...entry(), error: 'refused this request (HTTP 403: host not allowed)' };
    expect(statusText(summarize([forbidden], ''))).toBe('KCoral ● cpu · refused');
    const odd = { ...entry(), error: '/v1/info: answered HTTP 204 without a body' };
    expect(statusText(summarize([odd], ''))).toBe('KCoral ● cpu · not usable (see the panel)');
    expect(summarize([entry()], '').problem).toBe('');
  });

  it('says offline when the server named in the settings is not listed', () => {
    expect(statusText(summarize([entry()], 'other'))).toBe('KCoral ● offline');
    expect(summarize([entry()], 'other').reason).toMatch(/no configured KCoral server/);
  });

  it('says the Jupyter server is what gives no answer, not that KCoral is offline', () => {
    // A soak: with jupyter lab stopped, or its kcoral_jupyter server extension not enabled
    // (its routes answer 404), the status bar said `KCoral ● offline` and the panel `The
    // KCoral server extension cannot be reached.`: no KCoral server was asked at all, and
    // the missing extension never comes back by waiting.
    expect(unreachedKind(new TypeError('Failed to fetch'))).toBe('no-answer');
    expect(unreachedKind(new ApiError(404, '', 'HTTP 404'))).toBe('not-enabled');
    expect(unreachedKind(new ApiError(500, '', 'HTTP 500'))).toBe('refused');
    expect(statusText(summarize(null, ''))).toBe('KCoral ● no answer from Jupyter');
    expect(statusTitle(summarize(null, ''))).toBe(
      'The Jupyter server cannot be reached. Click to open the KCoral panel.'
    );
    const missing = summarize(null, '', null, 'not-enabled');
    expect(statusText(missing)).toBe('KCoral ● server extension not enabled');
    expect(statusTitle(missing)).toMatch(/jupyter server extension enable kcoral_jupyter/);
  });

  it('says no server yet, not offline, before a fresh install has started one', () => {
    expect(statusText(summarize([], ''))).toBe(
      'KCoral ○ no server yet (starts with the first cell)'
    );
    expect(statusTitle(summarize([], 'x'.slice(1)))).toMatch(/first %%kcoral cell/);
  });

  it("shows the server the focused notebook's kernel uses, else a configured one", () => {
    const configured = entry();
    const embedded = { ...entry('sm_90a'), name: 'local-1a2b3c4d', kernels: ['k1'] };
    const connected = { ...entry(), name: 'kernel-5e6f7a8b', kernels: ['k2'] };
    const servers = [configured, embedded, connected];
    expect(summarize(servers, '', 'k1').server).toBe('local-1a2b3c4d');
    expect(summarize(servers, '', 'k2').server).toBe('kernel-5e6f7a8b');
    expect(summarize(servers, '', 'k3').server).toBe('gpu'); // no record: the configured one
    // Another kernel's embedded server is never shown for this notebook.
    expect(statusText(summarize([embedded], '', 'k3'))).toMatch(/no server yet/);
  });
});

describe('job formatting', () => {
  it('prints unknown timings as a dash and known ones as whole milliseconds', () => {
    expect(formatMs(null)).toBe('–');
    expect(formatMs(12.6)).toBe('13');
  });

  it('orders jobs newest first and keeps jobs without a time last', () => {
    const jobs = [
      { job_id: 'none', submitted_at: null },
      { job_id: 'a', submitted_at: '2026-01-05T09:30:00Z' },
      { job_id: 'b', submitted_at: '2026-01-05T09:30:01.5Z' }
    ] as never[];
    expect(newestFirst(jobs).map((j: { job_id: string }) => j.job_id)).toEqual(['b', 'a', 'none']);
  });

  it('offers cancel only for queued and running jobs', () => {
    expect(['QUEUED', 'RUNNING', 'COMPLETED', 'CANCELLED'].map(isCancellable)).toEqual([
      true,
      true,
      false,
      false
    ]);
  });

  it('describes phases for the output pane', () => {
    expect(describePhase('queued', { position: 3 })).toBe('queued behind 3');
    expect(describePhase('queued', { position: 0 })).toBe('waiting for a worker');
    expect(describePhase('finished', { status: 'CANCELLED' })).toBe('finished: cancelled');
  });

  it("says a plain program's instruction as its step, from 1, and what it does", () => {
    // It said `instruction 2 run run_2`: the program's own words, and its index from 0.
    expect(describePhase('instruction', { index: 2, op: 'run', id: 'run_2' })).toBe(
      'step 3: running run_2'
    );
    expect(describePhase('instruction', { index: 0, op: 'upload', id: 'x' })).toBe(
      'step 1: uploading x'
    );
    expect(describePhase('instruction', { index: 1, op: 'get_function', id: 'f' })).toBe(
      'step 2: loading f'
    );
    // No step where the index is not a count; an op this panel does not know is kept as is.
    expect(describePhase('instruction', { index: '1', op: 'constructor', id: null })).toBe(
      'constructor'
    );
    expect(describePhase('instruction', {})).toBe('running');
  });
});
