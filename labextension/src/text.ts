/**
 * Turning values a KCoral server sent into text that can be shown. A server may send any
 * JSON, and some JSON cannot be coerced the usual way: `String()` and template literals
 * throw on an object whose own `toString` is not a function (`{"toString": 1}`). These
 * functions never throw.
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
