"use strict";
// A Worker's signals: SIGTERM and SIGINT ask it to stop (with handleSignals).

/**
 * Calls `stop` on SIGTERM and SIGINT; returns what removes those listeners.
 * @param {() => unknown} stop
 * @returns {() => void}
 */
function handleSignals(stop) {
  const onSignal = () => { stop(); };
  for (const s of ["SIGTERM", "SIGINT"]) process.on(s, onSignal);
  return () => { for (const s of ["SIGTERM", "SIGINT"]) process.removeListener(s, onSignal); };
}

module.exports = { handleSignals };
