/**
 * What jsdom lacks that Lumino's widgets read when they load: `DragEvent` (a mouse event
 * is enough; no test drags). Imported before the panel by the tests that render it.
 */

const scope = globalThis as { DragEvent?: unknown };
if (scope.DragEvent === undefined) {
  scope.DragEvent = class DragEvent extends MouseEvent {};
}

export {};
