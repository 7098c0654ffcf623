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

  it('shows the server named in the settings', async () => {
    const m = model(() => [server('a', true, 'sm_90a'), server('b', true)], 'b');
    await m.poll();
    expect(m.summary).toMatchObject({ online: true, server: 'b', target: 'cpu' });
  });

  it('fails the poll (so the poller backs off) when the shown server is unreachable', async () => {
    const m = model(() => [server('a', false)]);
    await expect(m.poll()).rejects.toThrow('connection refused');
    expect(m.summary.online).toBe(false);
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
