-- Least-privilege roles for wlproj, applied by a superuser (or the database
-- owner) with psql:
--
--   psql -X -v ON_ERROR_STOP=1 -v dbname=app \
--        -v owner_password="$OWNER_PW" -v runtime_password="$RUNTIME_PW" \
--        -f deploy/sql/roles.sql "postgres://postgres@db-host/app"
--
-- Variables:
--   dbname            required; must be the database psql is connected to
--   owner_role        defaults to wlproj_owner: owns the outbox objects and
--                     applies migrations (wlproj migrate)
--   runtime_role      defaults to wlproj_runtime: what `wlproj run` logs in as
--   owner_password    optional; unset leaves the role's password as it is
--   runtime_password  optional; likewise
--
-- The script is idempotent and declarative: every run resets the runtime
-- role's table privileges to the list below. Run it once before the first
-- migration (so the owner can create the schema) and again after every
-- migration (so new objects get their grants), or only after migrating as
-- an admin: it then hands the outbox objects over to the owner role.
--
-- The runtime role gets no DDL: it owns nothing, cannot create in the schema
-- or the database, may update only the lifecycle columns of outbox_events
-- (producers write the event columns), and deletes only what the leader's
-- pruners and the archive remove. Its TEMPORARY privilege
-- comes from PUBLIC's default on the database; that is left alone because
-- the outbox lives in the application's database.

\set ON_ERROR_STOP on
\set QUIET on

\if :{?dbname}
\else
  \warn 'roles.sql: set -v dbname=<database> (the database this connection is on)'
  DO $$ BEGIN RAISE EXCEPTION 'roles.sql: dbname is not set'; END $$;
\endif
\if :{?owner_role}
\else
  \set owner_role wlproj_owner
\endif
\if :{?runtime_role}
\else
  \set runtime_role wlproj_runtime
\endif

-- The same guard as wlproj migrate --expect-db: a wrong connection string
-- must not hand somebody else's database to these roles.
SELECT format('DO $x$ BEGIN RAISE EXCEPTION %L; END $x$',
              format('roles.sql: connected to database %s, but dbname is %s; nothing was changed',
                     current_database(), :'dbname'))
 WHERE current_database() <> :'dbname' \gexec
SELECT format('DO $x$ BEGIN RAISE EXCEPTION %L; END $x$',
              'roles.sql: owner_role and runtime_role must differ')
 WHERE :'owner_role' = :'runtime_role' \gexec

BEGIN;

-- Roles are cluster-wide; create them once, then pin their attributes.
SELECT format('CREATE ROLE %I', r)
  FROM unnest(ARRAY[:'owner_role', :'runtime_role']) AS r
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) \gexec
ALTER ROLE :"owner_role" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER ROLE :"runtime_role" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT;
\if :{?owner_password}
  ALTER ROLE :"owner_role" PASSWORD :'owner_password';
\endif
\if :{?runtime_password}
  ALTER ROLE :"runtime_role" PASSWORD :'runtime_password';
\endif
-- Membership in the owner role would give the runtime role DDL through SET ROLE.
SELECT format('REVOKE %I FROM %I', :'owner_role', :'runtime_role')
 WHERE pg_has_role(:'runtime_role', :'owner_role', 'MEMBER') \gexec

GRANT CONNECT, TEMPORARY ON DATABASE :"dbname" TO :"owner_role";
GRANT CONNECT ON DATABASE :"dbname" TO :"runtime_role";

-- Postgres 15 already revokes CREATE on public from PUBLIC; older versions
-- let every role create tables there.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO :"owner_role";
GRANT USAGE ON SCHEMA public TO :"runtime_role";

-- Objects an admin migrated go to the owner role, which migrates from now on.
-- ALTER TABLE carries the table's indexes, trigger and serial sequences along.
-- A view reads its tables with its owner's rights: one left to an admin
-- would read as a superuser.
SELECT format('ALTER %s %s OWNER TO %I', CASE c.relkind WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END,
              c.oid::regclass, :'owner_role')
  FROM pg_class c
 WHERE c.oid IN (to_regclass('public.outbox_events'), to_regclass('public.outbox_leader'),
                 to_regclass('public.outbox_replay_audit'), to_regclass('public.goose_db_version'),
                 to_regclass('public.outbox_applied'), to_regclass('public.outbox_dead_letter'),
                 to_regclass('public.outbox_projection_state'), to_regclass('public.chronicle_events'),
                 to_regclass('public.outbox_rebuilds'), to_regclass('public.outbox_console_sessions'),
                 to_regclass('public.outbox_verify_runs'), to_regclass('public.outbox_positions'),
                 to_regclass('public.outbox_queue_origin'), to_regclass('public.outbox_done_by_minute'),
                 to_regclass('public.outbox_event_states'), to_regclass('public.outbox_queue_heads'),
                 to_regclass('public.outbox_queue_backlog'), to_regclass('public.outbox_ledger'),
                 to_regclass('public.outbox_ledger_0'), to_regclass('public.outbox_ledger_1'),
                 to_regclass('public.outbox_ledger_2'), to_regclass('public.outbox_ledger_rotation'),
                 to_regclass('public.outbox_ledger_entries'), to_regclass('public.outbox_events_0'),
                 to_regclass('public.outbox_events_1'), to_regclass('public.outbox_events_2'),
                 to_regclass('public.outbox_events_rotation'), to_regclass('public.outbox_queue_home'))
   AND c.relowner <> (SELECT oid FROM pg_roles WHERE rolname = :'owner_role') \gexec
SELECT format('ALTER FUNCTION %s OWNER TO %I', p.oid::regprocedure, :'owner_role')
  FROM pg_proc p
 WHERE p.oid IN (to_regprocedure('public.outbox_append_error(jsonb, jsonb, integer)'),
                 to_regprocedure('public.outbox_events_notify()'),
                 to_regprocedure('public.outbox_behind(xid8, bigint, pg_snapshot, pg_snapshot, xid8, bigint)'),
                 to_regprocedure('public.outbox_queue_backlog_rows(bigint)'),
                 to_regprocedure('public.outbox_ledger_slot()'),
                 to_regprocedure('public.outbox_ledger_entry(text, text, text)'),
                 to_regprocedure('public.outbox_applied_to_ledger()'),
                 to_regprocedure('public.outbox_ledger_barrier()'),
                 to_regprocedure('public.outbox_events_slot()'),
                 to_regprocedure('public.outbox_events_stamp_xid()'),
                 to_regprocedure('public.outbox_new_row_status()'))
   AND p.proowner <> (SELECT oid FROM pg_roles WHERE rolname = :'owner_role') \gexec

SELECT to_regclass('public.outbox_events') IS NOT NULL
   AND to_regclass('public.outbox_leader') IS NOT NULL
   AND to_regclass('public.outbox_replay_audit') IS NOT NULL
   AND to_regprocedure('public.outbox_append_error(jsonb, jsonb, integer)') IS NOT NULL AS have_outbox \gset
\if :have_outbox
  -- Start from nothing so that a privilege dropped from this list is also
  -- dropped from the database on the next run.
  REVOKE ALL ON public.outbox_events, public.outbox_leader, public.outbox_replay_audit FROM :"runtime_role";
  SELECT format('REVOKE ALL ON SEQUENCE %s FROM %I', s, :'runtime_role')
    FROM unnest(ARRAY[pg_get_serial_sequence('public.outbox_events', 'id'),
                      pg_get_serial_sequence('public.outbox_replay_audit', 'id')]) AS s \gexec
  -- Tables of later migrations, once they exist.
  SELECT format('REVOKE ALL ON %s FROM %I', t, :'runtime_role')
    FROM unnest(ARRAY[to_regclass('public.goose_db_version'),
                      to_regclass('public.outbox_applied'), to_regclass('public.outbox_dead_letter'),
                      to_regclass('public.outbox_projection_state'), to_regclass('public.chronicle_events'),
                      to_regclass('public.outbox_rebuilds'), to_regclass('public.outbox_console_sessions'),
                      to_regclass('public.outbox_verify_runs'), to_regclass('public.outbox_positions'),
                      to_regclass('public.outbox_queue_origin'), to_regclass('public.outbox_done_by_minute'),
                      to_regclass('public.outbox_event_states'), to_regclass('public.outbox_queue_heads'),
                      to_regclass('public.outbox_queue_backlog'), to_regclass('public.outbox_ledger'),
                      to_regclass('public.outbox_ledger_0'), to_regclass('public.outbox_ledger_1'),
                      to_regclass('public.outbox_ledger_2'), to_regclass('public.outbox_ledger_rotation'),
                      to_regclass('public.outbox_ledger_entries'), to_regclass('public.outbox_events_0'),
                      to_regclass('public.outbox_events_1'), to_regclass('public.outbox_events_2'),
                      to_regclass('public.outbox_events_rotation'), to_regclass('public.outbox_queue_home')]) AS t
   WHERE t IS NOT NULL \gexec
  SELECT format('REVOKE ALL ON FUNCTION %s FROM %I', f, :'runtime_role')
    FROM unnest(ARRAY[to_regprocedure('public.outbox_behind(xid8, bigint, pg_snapshot, pg_snapshot, xid8, bigint)'),
                      to_regprocedure('public.outbox_queue_backlog_rows(bigint)'),
                      to_regprocedure('public.outbox_ledger_slot()'),
                      to_regprocedure('public.outbox_ledger_entry(text, text, text)'),
                      to_regprocedure('public.outbox_events_slot()')]) AS f
   WHERE f IS NOT NULL \gexec

  -- Claim, ack, retry, reclaim, release and replay read the rows and change
  -- only the lifecycle columns.
  GRANT SELECT ON public.outbox_events TO :"runtime_role";
  GRANT UPDATE (status, attempts, next_retry_at, locked_by, lease_until, processing_started_at,
                claim_token, claim_seq, processed_at, error_class, error_reason, last_error, error_history,
                replay_count, updated_at)
     ON public.outbox_events TO :"runtime_role";
  -- An archive deletes the rows it moves to the dead letter. Events are
  -- never inserted into outbox_events by this role.
  GRANT DELETE ON public.outbox_events TO :"runtime_role";
  -- The outbox's rotation (21) moves the rows still needed out of the
  -- partition it empties into the current one (a DELETE and an INSERT of
  -- the same row, on the partitions), empties it with TRUNCATE, and moves
  -- the rotation's row. No UPDATE on a partition: the carry locks the rows
  -- it moves (FOR UPDATE SKIP LOCKED) through the parent, on whose
  -- lifecycle columns the role has UPDATE already; a partition's own
  -- privileges are checked only where it is named.
  SELECT format('GRANT SELECT, INSERT, DELETE, TRUNCATE ON %s TO %I', t, :'runtime_role')
    FROM unnest(ARRAY[to_regclass('public.outbox_events_0'), to_regclass('public.outbox_events_1'),
                      to_regclass('public.outbox_events_2')]) AS t
   WHERE t IS NOT NULL \gexec
  SELECT format('GRANT SELECT, UPDATE (slot, opened_at) ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_events_rotation') AS t WHERE t IS NOT NULL \gexec
  -- The ledger of before schema 19: a binary of before 19 reads it, its ack
  -- moves it forward and its pruner trims it, until a binary of 19 leads.
  SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_applied') AS t WHERE t IS NOT NULL \gexec
  -- The ledger (19): the claim reads it, the ack and the rotation's carry
  -- insert into it (never an UPDATE or a DELETE), and the rotation empties a
  -- partition with TRUNCATE and moves the rotation's row; the first leader
  -- of 19 sets log_only. The carry reads a partition through the parent
  -- (WHERE slot = n): no SELECT on the partitions.
  SELECT format('GRANT SELECT, INSERT ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_ledger') AS t WHERE t IS NOT NULL \gexec
  SELECT format('GRANT TRUNCATE ON %s TO %I', t, :'runtime_role')
    FROM unnest(ARRAY[to_regclass('public.outbox_ledger_0'), to_regclass('public.outbox_ledger_1'),
                      to_regclass('public.outbox_ledger_2')]) AS t
   WHERE t IS NOT NULL \gexec
  SELECT format('GRANT SELECT, UPDATE (slot, opened_at, log_only) ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_ledger_rotation') AS t WHERE t IS NOT NULL \gexec
  -- An archive inserts into the dead letter, a restore deletes from it, the
  -- ledger pruner reads it. Its rows are never updated: no UPDATE.
  SELECT format('GRANT SELECT, INSERT, DELETE ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_dead_letter') AS t WHERE t IS NOT NULL \gexec
  -- The claim skips the projections paused here; wlproj pause and resume
  -- change them, as the owner: an operator's decision, not the daemon's.
  SELECT format('GRANT SELECT ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_projection_state') AS t WHERE t IS NOT NULL \gexec
  -- The chronicle projection appends (ON CONFLICT DO NOTHING on the event
  -- id); its rows are never changed or deleted by the daemon.
  SELECT format('GRANT SELECT, INSERT ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.chronicle_events') AS t WHERE t IS NOT NULL \gexec
  -- The leader reads open rebuilds and confirms it writes to both indexes
  -- (the columns this database's migrations have).
  SELECT format('GRANT SELECT, UPDATE (%s) ON %s TO %I', string_agg(quote_ident(a.attname), ', '), t, :'runtime_role')
    FROM to_regclass('public.outbox_rebuilds') AS t
    JOIN pg_attribute a ON a.attrelid = t AND NOT a.attisdropped
         AND a.attname IN ('dual_write_at', 'dual_write_by', 'dual_write_epoch', 'dual_write_leader',
                           'dual_write_seen_at', 'dual_write_since')
   GROUP BY t \gexec
  -- The console records a sign-in, reads the session on every request, ends
  -- it at sign-out, and deletes expired ones.
  SELECT format('GRANT SELECT, INSERT, UPDATE (revoked_at), DELETE ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_console_sessions') AS t WHERE t IS NOT NULL \gexec
  -- The scheduled verify keeps each projection's last run (upserted); the
  -- console reads it. Its repair deletes through the engine, never by
  -- inserting events.
  SELECT format('GRANT SELECT, INSERT, UPDATE ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_verify_runs') AS t WHERE t IS NOT NULL \gexec
  -- The leader reads queued rows from each projection's position and saves
  -- it (an upsert, at most once a second); positions are never deleted.
  SELECT format('GRANT SELECT, INSERT, UPDATE ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_positions') AS t WHERE t IS NOT NULL \gexec
  -- A projection's first position starts from the origin, which only the
  -- migration that makes rows queued (00018, as the owner) writes.
  SELECT format('GRANT SELECT ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_queue_origin') AS t WHERE t IS NOT NULL \gexec
  -- Every replica reads which cluster the positions belong to (schema 23)
  -- and leads only there; only wlproj queue rebase, as the owner, writes it.
  SELECT format('GRANT SELECT ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_queue_home') AS t WHERE t IS NOT NULL \gexec
  -- Each checkpoint adds its acks to their minute (an upsert), the console
  -- reads them, the pruner deletes old minutes.
  SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_done_by_minute') AS t WHERE t IS NOT NULL \gexec
  -- Status, gauges, the console, replay, verify, rebuild and the pruners
  -- read queued rows' state and backlog through these views.
  SELECT format('GRANT SELECT ON %s TO %I', t, :'runtime_role')
    FROM unnest(ARRAY[to_regclass('public.outbox_event_states'), to_regclass('public.outbox_queue_heads'),
                      to_regclass('public.outbox_queue_backlog'), to_regclass('public.outbox_ledger_entries')]) AS t
   WHERE t IS NOT NULL \gexec
  -- The views call these, and a view's caller needs EXECUTE on what it
  -- calls; the gauges call the backlog function directly. Granted to the
  -- runtime role rather than left to PUBLIC's default, which a hardened
  -- database may have revoked; PUBLIC keeps it: both only read, as the
  -- caller, what the caller may read already.
  SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', f, :'runtime_role')
    FROM unnest(ARRAY[to_regprocedure('public.outbox_behind(xid8, bigint, pg_snapshot, pg_snapshot, xid8, bigint)'),
                      to_regprocedure('public.outbox_queue_backlog_rows(bigint)'),
                      to_regprocedure('public.outbox_ledger_slot()'),
                      to_regprocedure('public.outbox_ledger_entry(text, text, text)'),
                      to_regprocedure('public.outbox_events_slot()')]) AS f
   WHERE f IS NOT NULL \gexec
  -- Every replica reads the schema version, and neither leads nor reports
  -- ready while it is older than its binary needs. Only wlproj migrate, as
  -- the owner, writes it.
  SELECT format('GRANT SELECT ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.goose_db_version') AS t WHERE t IS NOT NULL \gexec
  -- The elector upserts its row to bump the epoch (the fencing token).
  GRANT SELECT, INSERT, UPDATE ON public.outbox_leader TO :"runtime_role";
  -- and records the hash of the projections it runs (schema 22).
  SELECT format('GRANT SELECT, INSERT, UPDATE ON %s TO %I', t, :'runtime_role')
    FROM to_regclass('public.outbox_leader_projections') AS t WHERE t IS NOT NULL \gexec
  -- Auto-replay writes an audit row per replay, and reads them for its
  -- budget; discard and archive write theirs. Audit rows are never changed.
  GRANT SELECT, INSERT ON public.outbox_replay_audit TO :"runtime_role";
  SELECT format('GRANT USAGE ON SEQUENCE %s TO %I',
                pg_get_serial_sequence('public.outbox_replay_audit', 'id'), :'runtime_role') \gexec
  -- Functions are executable by PUBLIC by default; keep the history helper
  -- to the roles that write history. The trigger function needs no grant:
  -- triggers fire whatever the inserting role may execute.
  REVOKE EXECUTE ON FUNCTION public.outbox_append_error(jsonb, jsonb, integer) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION public.outbox_append_error(jsonb, jsonb, integer) TO :"runtime_role";
\else
  \echo 'roles.sql: no outbox tables yet; migrate as role' :owner_role 'and run this script again'
\endif

COMMIT;
