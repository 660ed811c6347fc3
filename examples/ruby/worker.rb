#!/usr/bin/env ruby
# A pg_claim worker in Ruby (the pg gem) for the example schema
# (examples/schema.sql): it sends the messages of `outbox`.
#
#     PGHOST=... PGDATABASE=app ruby examples/ruby/worker.rb [--exit-when-empty]
#
# The same worker as examples/python/worker.py (its docstring says what it
# does): claim_slots, my_items, a failure record per failed message, LISTEN on
# the slots' channels with a fallback poll, reconnect with back-off, exit on
# SIGTERM or SIGINT, or with --exit-when-empty once its slots have nothing left.
# Like it, it refuses to work behind a pooler (status 2) unless
# MAILER_SESSION_POOL=1 says the pool is in session mode.
#
# MAILER_MODE=lease: leases instead (claim_leases, docs/leases.md), which work
# through a transaction-mode pooler such as PgBouncer: any number of these
# workers shares the 8 slots, each message is sent in a transaction that
# starts with fence(), a worker polls (MAILER_POLL_S) instead of LISTENing,
# and gives its slots back when it stops. (The Python and Node.js examples
# do this through the worker libraries, clients/python and clients/node.)
require "pg"
require "socket"

NAME, N, BATCH = "mailer", 8, 50
MAX_ATTEMPTS = Integer(ENV.fetch("MAILER_MAX_ATTEMPTS", "5"))
BACKOFF = ENV.fetch("MAILER_BACKOFF", "10 seconds")
POLL_S = Float(ENV.fetch("MAILER_POLL_S", "30")) # the fallback poll
EXIT_WHEN_EMPTY = ARGV.include?("--exit-when-empty")
WORKER = "ruby-#{Process.pid}"
SESSION_POOL = ENV["MAILER_SESSION_POOL"] == "1" # a pooler in session mode is in between
LEASE = ENV.fetch("MAILER_MODE", "session") == "lease"
TTL = ENV.fetch("MAILER_TTL", "10 seconds")
HOLDER = "#{WORKER}-#{Socket.gethostname}-#{format("%08x", rand(2**32))}" # unique per process
$stopping = false
$stdout.sync = true

def say(*words) = puts(words.join(" "))

# The connection is not one server session: a pooler in between.
class NotASession < StandardError; end

# Deliver one message. Here: a row in `deliveries`, in the caller's
# transaction; the reserved domain .invalid stands for a bounce.
def send_message(conn, recipient, body, item)
  raise "550 no such mailbox: #{recipient}" if recipient.end_with?(".invalid")
  conn.exec_params("INSERT INTO deliveries (outbox_id, worker) VALUES ($1, $2)", [item, WORKER])
end

# docs/workers.md: begin
# the batch, with the failure records of its own messages only
FETCH = <<~SQL
  WITH o AS (SELECT * FROM my_items(NULL::outbox, $1, $2, after => $3, pending => 'sent_at', batch => $4))
  SELECT o.id, o.recipient, o.body, o.sent_at IS NULL AS pending, f.state AS failure
  FROM o LEFT JOIN item_failures($5, VARIADIC ARRAY(SELECT id::text FROM o)) f ON f.item = o.id::text
  ORDER BY o.id
SQL
CLAIM = "SELECT claim_slots($1, $2, $3, '1 second'), pg_backend_pid()"
# seconds until the first retry of a failed, still unsent message of the
# slots $3; NULL: none (a record of a message sent meanwhile by another kind of
# worker does not count)
NEXT_RETRY = <<~SQL
  SELECT extract(epoch FROM min(f.retry_at) - clock_timestamp())::float8 AS s
  FROM item_failures($1) f JOIN outbox o ON o.id = f.item::bigint AND o.sent_at IS NULL
  WHERE f.state <> 'dead' AND slot_of(o.id, $2) = ANY ($3::int[])
SQL

# This session's slots, claimed again: its own plus unserved ones.
def claim(conn, server)
  held, pid = conn.exec_params(CLAIM, [NAME, N, N]).values.first
  if pid != server # a transaction-mode pooler: the claim stays with another connection
    raise NotASession, "claim_slots ran in server process #{pid}, not #{server}: the pool is not in session mode"
  end
  held
end

# Send one message and mark it sent in one transaction; record a failure.
# With a lease's token, the transaction starts with fence(): if the slot has
# moved on to another worker, nothing of it commits (PG::RaiseException,
# SQLSTATE PC001, raised to the caller).
def process(conn, item, slot = nil, token = nil)
  conn.transaction do
    conn.exec_params("SELECT fence($1, $2, $3)", [NAME, slot, token]) if token
    if conn.exec_params("UPDATE outbox SET sent_at = now() WHERE id = $1 AND sent_at IS NULL",
                        [item["id"]]).cmd_tuples.zero?
      say("skipped", item["id"]) # sent meanwhile by another kind of worker (docs/migrating.md)
      next
    end
    send_message(conn, item["recipient"], item["body"], item["id"])
    # it failed before: forget that
    conn.exec_params("SELECT clear_failure($1, $2)", [NAME, item["id"]]) if item["failure"]
  end
rescue PG::Error
  raise # the database's error, not the message's: never recorded as its failure
rescue StandardError => e # the delivery failed
  state = conn.exec_params("SELECT record_failure($1, $2, $3, $4, $5)",
                           [NAME, item["id"], e.message, MAX_ATTEMPTS, BACKOFF]).getvalue(0, 0)
  say(state == "retry" ? "failed" : "dead", item["id"], e.message)
end

# Where each slot's walk over its share is: the last key of its batch,
# whether this pass sent something, and the slots whose last whole pass had
# nothing due (quiet: when every slot is, the worker waits).
class Walk
  def initialize = (@after, @busy, @quiet = {}, {}, {})

  # The due messages of slot s's next batch; the walk goes on after it.
  def next(conn, s)
    rows = conn.exec_params(FETCH, [s, N, @after[s], BATCH, NAME]).to_a
    due = rows.select { |r| r["pending"] && [nil, "due"].include?(r["failure"]) }
    unless due.empty?
      @busy[s] = true
      @quiet[s] = false
    end
    if rows.size < BATCH # the share is walked: quiet if nothing was due
      @after.delete(s)
      @quiet[s] = !@busy.delete(s)
    else
      @after[s] = rows.last["id"]
    end
    due
  end

  def forget(s) = [@after, @busy, @quiet].each { |h| h.delete(s) }
  def quiet?(slots) = slots.all? { |s| @quiet[s] }
  def wake = @quiet.clear
end

# Work until told to stop (true) or the share is empty (false).
def serve(conn, server)
  slots, walk = [], Walk.new
  until $stopping
    # between batches: take unserved slots, give one back to a waiting newcomer
    held = claim(conn, server)
    (slots | held).each do |s| # LISTEN on the channels of the slots held
      next if slots.include?(s) == held.include?(s)
      channel = conn.exec_params("SELECT slot_channel($1, $2)", [NAME, s]).getvalue(0, 0)
      conn.exec("#{held.include?(s) ? "LISTEN" : "UNLISTEN"} #{conn.quote_ident(channel)}")
      walk.forget(s)
    end
    say("slots", *held) if held != slots
    slots = held
    slots.each do |s| # one batch of each slot's share
      walk.next(conn, s).each do |item|
        return true if $stopping
        process(conn, item)
      end
    end
    next if slots.empty? || !walk.quiet?(slots)
    retry_in = conn.exec_params(NEXT_RETRY, [NAME, N, PG::TextEncoder::Array.new.encode(slots)]).getvalue(0, 0)
    return false if retry_in.nil? && EXIT_WHEN_EMPTY
    say("waiting")
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + (retry_in.nil? ? POLL_S : [POLL_S, [retry_in, 0.1].max].min)
    until $stopping || (left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)) <= 0
      if wait(conn, [left, 1].min)
        say("woken")
        break
      end
      # each second: claim again, as another worker may have given a slot up for this one
      break if claim(conn, server) != slots
    end
    walk.wake # woken or not: walk every share again
  end
  true
end
# docs/workers.md: end

# Lease mode: the slots are leases of this worker's holder, claimed again
# (and renewed) between batches; true when told to stop, false when empty.
LEASES = "SELECT slot, token FROM claim_leases($1, $2, $3, ttl => $4::interval) ORDER BY slot"

def serve_leases(conn, holder)
  slots, walk = [], Walk.new
  # claim again (which renews) at least every third of the TTL
  renew_s = conn.exec_params("SELECT extract(epoch FROM $1::interval)::float8 / 3", [TTL]).getvalue(0, 0)
  until $stopping
    held = conn.exec_params(LEASES, [NAME, N, holder, TTL]).to_a.to_h { |r| [r["slot"], r["token"]] }
    say("slots", *held.keys) if held.keys != slots
    (slots - held.keys).each { |s| walk.forget(s) }
    slots = held.keys
    held.each do |s, token| # one batch of each slot's share
      walk.next(conn, s).each do |item|
        return true if $stopping
        process(conn, item, s, token)
      end
    rescue PG::Error => e
      raise unless e.result&.error_field(PG::Result::PG_DIAG_SQLSTATE) == "PC001"
      say("fenced", s) # the lease moved on: claim again
      walk.forget(s)
    end
    next unless slots.empty? || walk.quiet?(slots)
    retry_in = conn.exec_params(NEXT_RETRY, [NAME, N, PG::TextEncoder::Array.new.encode(slots)]).getvalue(0, 0)
    return false if retry_in.nil? && EXIT_WHEN_EMPTY
    say("waiting")
    wait_s = [POLL_S, renew_s, retry_in.nil? ? POLL_S : [retry_in, 0.1].max].min
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + wait_s
    sleep 0.05 until $stopping || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    walk.wake
  end
  true
ensure
  begin
    conn.exec_params("SELECT count(*) FROM claim_leases($1, $2, $3, max => 0)", [NAME, N, holder]) unless conn.finished?
  rescue PG::Error
    nil # the leases expire after the TTL
  end
end

# Until a notification arrives (true), `seconds` pass or a signal comes.
def wait(conn, seconds)
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  until $stopping
    left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
    return false if left <= 0
    return true if conn.wait_for_notify([left, 0.5].min)
  end
  false
end

# The server process of this connection; refuses one behind a pooler.
def check_session(conn)
  pid = conn.exec("SELECT pg_backend_pid()").getvalue(0, 0)
  if pid != conn.backend_pid && !SESSION_POOL
    raise NotASession, "the server process (pid #{pid}) is not the one the connection was opened with" \
                       " (pid #{conn.backend_pid}): a connection pooler is in between. This worker holds its" \
                       " slots with session locks and LISTENs, which need one server session per connection:" \
                       " connect to PostgreSQL directly, or through a pool in session mode and set" \
                       " MAILER_SESSION_POOL=1. Behind a transaction-mode pooler use leases (docs/leases.md)."
  end
  pid
end

%w[TERM INT].each { |sig| Signal.trap(sig) { $stopping = true } }
pause = 0.1
loop do
  conn = PG.connect(application_name: NAME) # PGHOST, PGDATABASE, ... from the environment
  # typed results: integers, booleans, arrays and floats instead of strings
  conn.type_map_for_results = PG::BasicTypeMapForResults.new(conn)
  pause = 0.1
  told = LEASE ? serve_leases(conn, HOLDER) : serve(conn, check_session(conn))
  conn.close
  say("exit", told ? "told to stop" : "nothing left")
  break
rescue NotASession => e
  conn&.close unless conn&.finished?
  say("exit", "refused:", e.message)
  exit 2
rescue PG::ConnectionBad, PG::AdminShutdown, PG::UnableToSend => e # the server restarted, the network failed, ...
  conn&.close unless conn&.finished?
  say("reconnecting", "in #{pause} s:", e.message.lines.first.to_s.strip)
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + pause
  sleep 0.02 until $stopping || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
  if $stopping
    say("exit", "told to stop")
    break
  end
  pause = [pause * 2, 5].min
end
