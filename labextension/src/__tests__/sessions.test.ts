import { IInfo, ISession, KCoralApi } from '../api';
import {
  formatAge,
  formatBytes,
  formatTimeLeft,
  orderSessions,
  sessionSeatsText,
  sessionView
} from '../format';
import { jsonResponse } from './helpers';

const session = (over: Partial<ISession> = {}): ISession => ({
  session_id: '5f0c2a9e-8b7d-4c1e-9a3f-2d6b8e4c1a70',
  owner: 'alice',
  state: 'IDLE',
  gpu_count: null,
  gpu_ids: [],
  worker_id: 'session/5f0c2a9e',
  created_at: 1_000,
  last_program_finished_at: 1_100,
  idle_timeout_seconds: 600,
  idle_deadline: 1_700,
  programs: 3,
  end_reason: null,
  end_message: null,
  server: 'gpu',
  observed_at: 1_250,
  ...over
});

describe('a session in the panel', () => {
  it('counts idle time and the time left on the KCoral server clock, not the browser', () => {
    const view = sessionView(session(), 999_999);
    expect(view.state).toBe('idle 2 min · ends in 8 min');
    expect([view.shortId, view.owner, view.gpu, view.memory]).toEqual([
      '5f0c2a9e',
      'alice',
      'CPU',
      'mem –'
    ]);
    expect(view.live).toBe(true);
  });

  it('falls back to the browser clock when the server sent no Date', () => {
    const view = sessionView(session({ observed_at: null }), 1_110);
    expect(view.state).toBe('idle 10 s · ends in 10 min');
  });

  it('counts idle time from creation before the first program', () => {
    const view = sessionView(session({ last_program_finished_at: null, programs: 0 }), 0);
    expect(view.state).toBe('idle 4 min · ends in 8 min');
    expect(view.title).toContain('0 programs');
  });

  it('rounds the time left up, so idle time plus time left never falls short of the limit', () => {
    // 7 min 30 s left: idle 2 min 30 s is shown as 2 min, the time left as 8 min
    expect(sessionView(session({ observed_at: 1_250 }), 0).state).toBe(
      'idle 2 min · ends in 8 min'
    );
    expect(formatTimeLeft(58.2)).toBe('59 s');
    expect(formatTimeLeft(59.2)).toBe('1 min');
    expect(formatTimeLeft(60)).toBe('1 min');
    expect(formatTimeLeft(61)).toBe('2 min');
    expect(formatTimeLeft(3_599)).toBe('1 h');
    expect(formatTimeLeft(3_601)).toBe('1 h 1 min');
    expect(formatTimeLeft(7_200)).toBe('2 h');
  });

  it('says a session past its deadline is ending rather than a negative time', () => {
    expect(sessionView(session({ observed_at: 1_701 }), 0).state).toBe(
      'idle 10 min · ending'
    );
  });

  it('shows running and ended sessions without an idle clock', () => {
    expect(sessionView(session({ state: 'RUNNING', idle_deadline: null }), 0).state).toBe(
      'running a program'
    );
    const ended = sessionView(
      session({
        state: 'ENDED',
        idle_deadline: null,
        end_reason: 'idle_timeout',
        end_message: 'session ended after 600 s without a program (--session-idle-seconds)'
      }),
      0
    );
    expect(ended.state).toBe('ended: idle too long');
    expect(ended.live).toBe(false);
    expect(ended.title).toContain('--session-idle-seconds');
  });

  it('shows fields of the wrong type from a rogue server as unknown, without failing', () => {
    const rogue = {
      ...session(),
      owner: { html: '<b>' },
      gpu_ids: ['<img>', 2],
      end_reason: 5,
      end_message: ['x'],
      worker_id: 3,
      state: 'ENDED'
    } as unknown as ISession;
    const view = sessionView(rogue, 0);
    expect([view.owner, view.gpu, view.state]).toEqual(['–', 'GPU 2', 'ended']);
    expect(view.title).not.toContain('worker');
  });

  it('names its GPUs and the memory of its worker', () => {
    const view = sessionView(session({ gpu_count: 1, gpu_ids: [3], memory_bytes: 431_000_000 }), 0);
    expect([view.gpu, view.memory]).toEqual(['GPU 3', 'mem 411 MiB']);
  });

  it('puts the whole id, its server and its worker in the tooltip', () => {
    expect(sessionView(session(), 0).title).toBe(
      'session 5f0c2a9e-8b7d-4c1e-9a3f-2d6b8e4c1a70 on gpu\n' +
        'worker session/5f0c2a9e · 3 programs · ends after 10 min without a program'
    );
  });

  it('lists live sessions first, then the newest', () => {
    const ordered = orderSessions([
      session({ session_id: 'ended-new', state: 'ENDED', created_at: 3_000 }),
      session({ session_id: 'idle-old', created_at: 1_000 }),
      session({ session_id: 'running-new', state: 'RUNNING', created_at: 2_000 })
    ]);
    expect(ordered.map(s => s.session_id)).toEqual(['running-new', 'idle-old', 'ended-new']);
  });
});

describe('numbers for narrow places', () => {
  it('rounds bytes to binary units', () => {
    expect(formatBytes(null)).toBe('–');
    expect(formatBytes(undefined)).toBe('–');
    expect(formatBytes(-1)).toBe('–');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(1.25 * 1024 ** 3)).toBe('1.3 GiB');
    expect(formatBytes(20 * 1024 ** 3)).toBe('20 GiB');
  });

  it('rounds ages down to their largest whole units', () => {
    expect(formatAge(-3)).toBe('0 s');
    expect(formatAge(59.9)).toBe('59 s');
    expect(formatAge(600)).toBe('10 min');
    expect(formatAge(3_600)).toBe('1 h');
    expect(formatAge(7_500)).toBe('2 h 5 min');
  });

  it('says how many session seats are held, only on servers that offer sessions', () => {
    const info = (sessions?: IInfo['sessions']): IInfo => ({
      kcoral: '0.1.0',
      protocol: 1,
      features: [],
      device: 'cpu',
      sessions
    });
    expect(sessionSeatsText(info({ max: 2, active: 1, idle_timeout_seconds: 600 }))).toBe(
      '1/2 seats held · 10 min idle limit'
    );
    expect(sessionSeatsText(info())).toBe('');
    expect(sessionSeatsText(null)).toBe('');
  });
});

describe('the session routes of the extension', () => {
  it('lists sessions and stops one with DELETE, naming its server', async () => {
    const fetcher = jest.fn(async (path: string, _init?: RequestInit) =>
      path === 'sessions'
        ? jsonResponse({ sessions: [session()], errors: [] })
        : jsonResponse(session({ state: 'ENDED', end_reason: 'deleted' }))
    );
    const api = new KCoralApi(fetcher);
    expect((await api.sessions()).sessions.map(s => s.owner)).toEqual(['alice']);
    const ended = await api.stopSession('5f0c/2a9e', 'gpu box');
    expect(ended?.end_reason).toBe('deleted');
    expect(fetcher).toHaveBeenLastCalledWith('sessions/5f0c%2F2a9e?server=gpu%20box', {
      method: 'DELETE'
    });
  });

  it('reads a malformed answer as no sessions', async () => {
    const api = new KCoralApi(async () => jsonResponse({ sessions: 'nope' }));
    expect(await api.sessions()).toEqual({ sessions: [], errors: [] });
  });

  it('drops records without a string id that a rogue server sends', async () => {
    const api = new KCoralApi(async () =>
      jsonResponse({ sessions: [null, 7, { session_id: 12 }, session()], errors: [] })
    );
    expect((await api.sessions()).sessions.map(s => s.session_id)).toEqual([
      session().session_id
    ]);
  });
});

describe('the words a session card uses', () => {
  it('says a session stopped from the panel is stopped, and why others ended, in words', () => {
    const ended = (end_reason: string): string =>
      sessionView(session({ state: 'ENDED', idle_deadline: null, end_reason }), 0).state;
    expect(ended('deleted')).toBe('stopped');
    expect(ended('idle_timeout')).toBe('ended: idle too long');
    expect(ended('worker_exited')).toBe('ended: its worker exited');
    expect(ended('shutdown')).toBe('ended: the server shut down');
    expect(ended('some_new_reason')).toBe('ended: some new reason');
    // A rogue server's reason is text, never a key of an object's prototype.
    expect(ended('constructor')).toBe('ended: constructor');
  });

  it('names the server by the label it is given', () => {
    const view = sessionView(session({ server: 'local-4242' }), 0, 'local server of a.ipynb');
    expect(view.title).toContain('on local server of a.ipynb');
  });
});
