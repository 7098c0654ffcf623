import { ApiError, KCoralApi } from '../api';
import { jsonResponse, streamResponse } from './helpers';

describe('KCoralApi', () => {
  it('asks the extension routes and unwraps their documents', async () => {
    const fetcher = jest.fn(async (path: string) => {
      if (path === 'servers') {
        return jsonResponse({ servers: [{ name: 'a' }] });
      }
      return jsonResponse({ jobs: [{ job_id: 'j' }], errors: [] });
    });
    const api = new KCoralApi(fetcher);
    expect((await api.servers()).map(s => s.name)).toEqual(['a']);
    expect((await api.jobs()).jobs.map(j => j.job_id)).toEqual(['j']);
  });

  it('reads a rogue server entry with the wrong types as unhealthy, not as a failure', async () => {
    const fetcher = async () =>
      jsonResponse({
        servers: [
          7,
          { url: 'http://nameless' },
          {
            name: 'rogue',
            url: 'http://rogue',
            health: { status: 'ok', load: 'busy', versions: { torch: { x: 1 } } },
            info: { kcoral: ['1'], sessions: { max: 'many' } },
            features: 'sessions',
            kernels: [1, 'k']
          }
        ]
      });
    const [rogue, ...rest] = await new KCoralApi(fetcher).servers();
    expect(rest).toEqual([]);
    expect(rogue.health).toBeNull();
    expect(rogue.error).toBe('the server answered /health without its load counts');
    expect(rogue.features).toEqual([]);
    expect(rogue.kernels).toEqual(['k']);
    expect(rogue.info).toMatchObject({ kcoral: '', sessions: undefined });
  });

  it('cancels with DELETE on the job, naming the server that has it', async () => {
    const fetcher = jest.fn(async () => jsonResponse({ job_id: 'j/1', status: 'CANCELLED' }));
    await new KCoralApi(fetcher).cancel('j/1', 'gpu box');
    expect(fetcher).toHaveBeenCalledWith('jobs/j%2F1?server=gpu%20box', { method: 'DELETE' });
  });

  it('sends Last-Event-ID when resuming an event stream', async () => {
    const fetcher = jest.fn(async (_path: string, _init?: RequestInit) => streamResponse([]));
    const signal = new AbortController().signal;
    await new KCoralApi(fetcher).events('j', '41', signal);
    const [path, init] = fetcher.mock.calls[0];
    expect(path).toBe('jobs/j/events');
    expect((init!.headers as Record<string, string>)['Last-Event-ID']).toBe('41');
    expect(init!.signal).toBe(signal);
  });

  it('turns an error answer into an ApiError with the KCoral kind', async () => {
    const fetcher = async () =>
      jsonResponse({ error: { kind: 'job_expired', message: 'gone' } }, 404);
    const error = await new KCoralApi(fetcher).job('j').catch(e => e);
    expect(error).toBeInstanceOf(ApiError);
    expect([error.status, error.kind, error.message]).toEqual([404, 'job_expired', 'gone']);
  });
});
