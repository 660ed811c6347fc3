"use strict";
/**
 * pg-claim: worker library for pg_claim, the PostgreSQL extension that shares
 * a table's rows among a fleet of workers by slot.
 * @module pg-claim
 */
const { Worker, NotASessionError } = require("./lib/worker");
const { makeHolder, isConnectionLost, isTransient, durationMs } = require("./lib/util");
const { Stats } = require("./lib/metrics");
const { describe } = require("./lib/vocabulary");
const { Held } = require("./lib/held");

module.exports = { Worker, NotASessionError, Held, Stats, describe, makeHolder, isConnectionLost, isTransient, durationMs };
