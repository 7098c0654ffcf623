/** Builders for fake fetch responses and event streams. */

/** A Response whose body yields `chunks` (strings or raw bytes) one read at a time. */
export function streamResponse(chunks: (string | Uint8Array)[], status = 200): Response {
  const encoder = new TextEncoder();
  let index = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (index < chunks.length) {
        const chunk = chunks[index++];
        controller.enqueue(typeof chunk === 'string' ? encoder.encode(chunk) : chunk);
      } else {
        controller.close();
      }
    }
  });
  return new Response(body, { status, headers: { 'Content-Type': 'text/event-stream' } });
}

export function jsonResponse(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });
}

/** One SSE message as a server writes it. */
export function sse(event: string, id: number, data: unknown): string {
  return `event: ${event}\nid: ${id}\ndata: ${JSON.stringify(data)}\n\n`;
}

export function health(busy: number, capacity: number, queued: number, arch?: string) {
  return {
    status: 'ok',
    instance_id: 'i',
    started_at: '2026-01-05T09:30:00.123456Z',
    gpu_count: arch ? 1 : 0,
    load: { request_capacity: capacity, requests_in_progress: busy, requests_waiting: queued },
    target: arch ? { arch } : {},
    versions: {}
  };
}
