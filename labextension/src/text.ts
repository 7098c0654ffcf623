/**
 * Turning values a KCoral server sent into text that can be shown. A server may send any
 * JSON, and some JSON cannot be coerced the usual way: `String()` and template literals
 * throw on an object whose own `toString` is not a function (`{"toString": 1}`). These
 * functions never throw. Also the two helpers the panel's parts share: `element` (a new
 * element with a class and a text) and `unreachedText` (an error as the panel says it).
 */

export function isFiniteNumber(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/**
 * `value` as text: a string as it is, a number or a boolean as JavaScript writes it, ''
 * for null and undefined, anything else as its JSON (`?` where even that fails).
 */
export function shownText(value: unknown): string {
  switch (typeof value) {
    case 'string':
      return value;
    case 'number':
    case 'boolean':
    case 'bigint':
      return String(value);
    case 'undefined':
      return '';
    default:
      if (value === null) {
        return '';
      }
      try {
        return JSON.stringify(value) ?? '?';
      } catch {
        return '?'; // a cycle, or a toJSON that throws: not from JSON.parse, but never fail
      }
  }
}

/** A new `tag` element with a class and a text (both optional). */
export function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

/** Why a request of the panel got no answer, in words: the browser's own `TypeError` for
 * a connection that failed (`Failed to fetch`, `network error`) says the Jupyter server
 * cannot be reached; any other error its message. */
export function unreachedText(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof TypeError && /fetch|network|load failed/i.test(message)) {
    return 'the Jupyter server cannot be reached';
  }
  return message;
}
