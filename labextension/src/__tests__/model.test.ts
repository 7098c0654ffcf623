import { IServerEntry, KCoralApi } from '../api';
import { KCoralModel } from '../model';
import { health, jsonResponse } from './helpers';

function server(name: string, reachable: boolean, arch?: string): IServerEntry {
  return {
    name,
    url: `http://127.0.0.1/${name}`,
    auth: false,
    health: reachable ? health(1, 2, 3, arch) : null,
    info: reachable ? { kcoral: '0.1.0', protocol: 1, features: ['jobs'], device: 'cpu' } : null,
    features: reachable ? ['jobs'] : [],
    reachable,
    error: reachable ? undefined : 'connection refused'
  };
}

function model(servers: () => IServerEntry[] | Error, statusServer = ''): KCoralModel {
  const fetcher = async (path: string) => {
    if (path === 'servers') {
      const value = servers();
      if (value instanceof Error) {
        throw value;
      }
      return jsonResponse({ servers: value });
    }
    return jsonResponse({
      jobs: [
        { job_id: 'old', submitted_at: '2026-01-05T09:30:00Z', status: 'COMPLETED' },
        { job_id: 'new', submitted_at: '2026-01-05T09:31:00Z', status: 'RUNNING' }
      ],
      errors: []
    });
  };
  return new KCoralModel(new KCoralApi(fetcher), { pollIntervalMs: 1000, statusServer });
}

describe('KCoralModel', () => {
  it('summarizes the first server and sorts jobs newest first', async () => {
    const m = model(() => [server('a', true, 'sm_90a'), server('b', true)]);
    const changed = jest.fn();
    m.subscribe(changed);
    await m.poll();
    expect(changed).toHaveBeenCalledTimes(1);
    expect(m.summary).toMatchObject({ online: true, server: 'a', target: 'sm_90a' });
    expect(m.jobs.map(j => j.job_id)).toEqual(['new', 'old']);
  });

  it('shows the servers while a server holds the jobs answer up', async () => {
    // A router relaying /v1/jobs to a node that stopped answering held the jobs route for
    // the whole request timeout (10 s), and with it every card and the status bar, which
    // kept the router's last `health ok` while its /health said unavailable.
    let answerJobs: (response: Response) => void = () => undefined;
    const fetcher = async (path: string): Promise<Response> => {
      if (path === 'servers') {
        return jsonResponse({ servers: [server('a', false)] });
      }
      if (path === 'jobs') {
        return new Promise<Response>(resolve => (answerJobs = resolve));
      }
      return jsonResponse({ sessions: [], errors: [] });
    };
    const m = new KCoralModel(new KCoralApi(fetcher), { pollIntervalMs: 1000, statusServer: '' });
    const changed = jest.fn();
    m.subscribe(changed);
    const polled = m.poll();
    while (changed.mock.calls.length === 0) {
      await new Promise(resolve => setTimeout(resolve, 10));
    }
    expect(m.summary).toMatchObject({ online: false, reason: 'connection refused' });
    expect(m.jobs).toEqual([]);
    answerJobs(jsonResponse({ jobs: [{ job_id: 'late', status: 'RUNNING' }], errors: [] }));
    await polled;
    expect(m.jobs.map(j => j.job_id)).toEqual(['late']);
    expect(changed).toHaveBeenCalledTimes(2);
  });

  it('shows the server named in the settings', async () => {
    const m = model(() => [server('a', true, 'sm_90a'), server('b', true)], 'b');
    await m.poll();
    expect(m.summary).toMatchObject({ online: true, server: 'b', target: 'cpu' });
  });

  it('says the shown server is offline without failing the poll', async () => {
    const m = model(() => [server('a', false)]);
    await expect(m.poll()).resolves.toBeUndefined();
    expect(m.summary).toMatchObject({ online: false, reason: 'connection refused' });
  });

  it('polls the sessions too, live first, and keeps them when one poll of them fails', async () => {
    let failSessions = false;
    const fetcher = async (path: string) => {
      if (path === 'servers') {
        return jsonResponse({ servers: [server('a', true)] });
      }
      if (path === 'sessions') {
        if (failSessions) {
          throw new TypeError('Failed to fetch');
        }
        return jsonResponse({
          sessions: [
            { session_id: 'gone', state: 'ENDED', created_at: 2 },
            { session_id: 'live', state: 'IDLE', created_at: 1 }
          ],
          errors: [{ server: 'b', message: 'HTTP 401' }]
        });
      }
      return jsonResponse({ jobs: [], errors: [] });
    };
    const m = new KCoralModel(new KCoralApi(fetcher), { pollIntervalMs: 1000, statusServer: '' });
    await m.poll();
    expect(m.sessions.map(s => s.session_id)).toEqual(['live', 'gone']);
    expect(m.sessionErrors).toEqual([{ server: 'b', message: 'HTTP 401' }]);
    failSessions = true;
    await m.poll();
    expect(m.sessions.map(s => s.session_id)).toEqual(['live', 'gone']);
  });

  it('goes offline when the server extension itself cannot be reached', async () => {
    let up = true;
    const m = model(() => (up ? [server('a', true)] : new TypeError('Failed to fetch')));
    await m.poll();
    expect(m.summary.online).toBe(true);
    up = false;
    await expect(m.poll()).rejects.toThrow('Failed to fetch');
    expect(m.servers).toBeNull();
    expect(m.summary.online).toBe(false);
  });
});

describe('KCoralModel polling (@lumino/polling)', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  function counted(fail: () => boolean, standby: () => boolean = () => false) {
    const calls = { servers: 0 };
    const fetcher = async (path: string) => {
      if (path === 'servers') {
        calls.servers++;
        if (fail()) {
          throw new TypeError('Failed to fetch');
        }
        return jsonResponse({ servers: [server('a', true)] });
      }
      return jsonResponse({ jobs: [], errors: [] });
    };
    const m = new KCoralModel(new KCoralApi(fetcher), {
      pollIntervalMs: 1000,
      maxIntervalMs: 9000,
      statusServer: '',
      standby: standby
    });
    return { m, calls };
  }

  it('polls at once, then every interval while the server extension answers', async () => {
    const { m, calls } = counted(() => false);
    m.start();
    await jest.advanceTimersByTimeAsync(10);
    expect(calls.servers).toBe(1);
    await jest.advanceTimersByTimeAsync(3000);
    expect(calls.servers).toBe(4);
    m.dispose();
    await jest.advanceTimersByTimeAsync(10_000);
    expect(calls.servers).toBe(4);
  });

  it('backs off while polls fail, up to the maximum, and recovers its interval', async () => {
    // Lumino spreads each delay at random; one fixed draw makes the count the same on every
    // run (a spread of lucky short delays once reached the bound below in CI).
    const random = jest.spyOn(Math, 'random').mockReturnValue(0.5);
    let failing = true;
    const { m, calls } = counted(() => failing);
    m.start();
    await jest.advanceTimersByTimeAsync(60_000);
    // Every second without back-off would be 60 tries; growing delays capped at 9 s leave
    // far fewer.
    expect(calls.servers).toBeGreaterThan(3);
    expect(calls.servers).toBeLessThan(20);
    failing = false;
    for (let waited = 0; !m.summary.online && waited < 30_000; waited += 100) {
      await jest.advanceTimersByTimeAsync(100); // until the next try, which succeeds ...
    }
    expect(m.summary.online).toBe(true);
    const recovered = calls.servers;
    await jest.advanceTimersByTimeAsync(3500); // ... and the interval is 1 s again
    expect(calls.servers - recovered).toBeGreaterThanOrEqual(3);
    m.dispose();
    random.mockRestore();
  });

  it('keeps its interval while a KCoral server is offline, and shows it back within one', async () => {
    // A soak: with the status bar's server stopped, the poll failed and backed off up to a
    // minute, so another server's 12 s job never showed as running (it showed done 35 s
    // after it started), and the restarted server showed offline 24 s after it was back.
    const random = jest.spyOn(Math, 'random').mockReturnValue(0.5);
    let up = false;
    const calls = { servers: 0 };
    const fetcher = async (path: string) => {
      if (path === 'servers') {
        calls.servers++;
        return jsonResponse({ servers: [server('a', up), server('b', true)] });
      }
      return jsonResponse({ jobs: [], errors: [] });
    };
    const m = new KCoralModel(new KCoralApi(fetcher), {
      pollIntervalMs: 1000,
      maxIntervalMs: 9000,
      statusServer: ''
    });
    m.start();
    await jest.advanceTimersByTimeAsync(30_500);
    expect(m.summary.online).toBe(false);
    expect(calls.servers).toBeGreaterThanOrEqual(30); // every second, as while all is well
    up = true;
    await jest.advanceTimersByTimeAsync(1000);
    expect(m.summary.online).toBe(true);
    m.dispose();
    random.mockRestore();
  });

  it('stands by while told to (a hidden page) and polls again afterwards', async () => {
    let hidden = false;
    const { m, calls } = counted(
      () => false,
      () => hidden
    );
    m.start();
    await jest.advanceTimersByTimeAsync(10);
    hidden = true;
    const before = calls.servers;
    await jest.advanceTimersByTimeAsync(30_000);
    expect(calls.servers).toBe(before);
    hidden = false;
    await jest.advanceTimersByTimeAsync(2000);
    expect(calls.servers).toBeGreaterThan(before);
    m.dispose();
  });

  it('refreshes at once on request and applies a new interval', async () => {
    const { m, calls } = counted(() => false);
    m.start();
    await jest.advanceTimersByTimeAsync(10);
    await m.poller.refresh();
    await jest.advanceTimersByTimeAsync(10);
    expect(calls.servers).toBe(2);
    m.configure(250, '');
    await jest.advanceTimersByTimeAsync(1100); // the tick already scheduled, then 250 ms
    const before = calls.servers;
    await jest.advanceTimersByTimeAsync(1000);
    expect(calls.servers - before).toBeGreaterThanOrEqual(3);
    m.dispose();
  });
});
