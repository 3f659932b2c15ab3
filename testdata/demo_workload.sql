-- A writing app's outbox traffic: libraries → bookshelves → books → blocks.
-- Books go to the books projection and blocks to the blocks projection, each
-- its own index (testdata/demo/projections.yaml). Every book and block is
-- written several times (event_version grows), rows arrive out of order, a
-- few blocks are deleted, and a handful of events are bad on purpose. Each
-- book edit and block delete is also an event of the chronicle projection (a
-- timeline that keeps every event). psql variable: round (1, 2, ...) shifts
-- versions so a second load supersedes the first.
\set ON_ERROR_STOP on
\if :{?round}
\else
\set round 1
\endif

INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
SELECT 'books', 'book', b.id, 'upsert', (:round - 1) * 3 + v,
       jsonb_build_object('kind', 'book', 'title', 'Book ' || b.id || ' draft ' || ((:round - 1) * 3 + v),
                          'author', 'author-' || (b.n % 17), 'library_id', b.lib, 'bookshelf_id', b.shelf,
                          'tags', jsonb_build_array('fiction', 'draft'), 'word_count', 1000 * v,
                          'updated_at', now()),
       b.lib
  FROM (SELECT 'lib' || l || '-shelf' || s || '-book' || k AS id, 'lib' || l AS lib,
               'lib' || l || '-shelf' || s AS shelf, k AS n
          FROM generate_series(1, 3) l, generate_series(1, 4) s, generate_series(1, 10) k) b,
       generate_series(1, 3) v
 ORDER BY random();

INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
SELECT 'blocks', 'block', bl.id, 'upsert', (:round - 1) * 4 + v,
       jsonb_build_object('kind', 'block', 'book_id', bl.book, 'library_id', bl.lib, 'position', bl.pos,
                          'body', 'Paragraph ' || bl.pos || ' revision ' || ((:round - 1) * 4 + v) || '. '
                                  || repeat('The quick brown fox jumps over the lazy dog. ', 18),
                          'updated_at', now()),
       bl.lib
  FROM (SELECT 'lib' || l || '-shelf' || s || '-book' || k || '-block' || p AS id,
               'lib' || l || '-shelf' || s || '-book' || k AS book, 'lib' || l AS lib, p AS pos
          FROM generate_series(1, 3) l, generate_series(1, 4) s, generate_series(1, 10) k,
               generate_series(1, 30) p) bl,
       generate_series(1, 3) v
 ORDER BY random();

-- Some blocks are deleted after their last edit. A round takes four versions
-- of a block, three edits and the delete, so that the next round's edits
-- come after the delete (one version used twice fails as version_reused).
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, scope_key)
SELECT 'blocks', 'block', 'lib1-shelf1-book' || k || '-block' || p, 'delete', :round * 4, 'lib1'
  FROM generate_series(1, 10) k, generate_series(1, 3) p;

-- The chronicle: who did what to each book, and the block deletes, every
-- version kept (the books and blocks indexes keep only the newest).
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
SELECT 'chronicle', 'book', 'lib' || l || '-shelf' || s || '-book' || k, 'upsert', (:round - 1) * 3 + v,
       jsonb_build_object('event', CASE WHEN (:round - 1) * 3 + v = 1 THEN 'created' ELSE 'edited' END,
                          'by', 'author-' || (k % 17), 'draft', (:round - 1) * 3 + v, 'word_count', 1000 * v),
       'lib' || l
  FROM generate_series(1, 3) l, generate_series(1, 4) s, generate_series(1, 10) k, generate_series(1, 3) v
 ORDER BY random();
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
SELECT 'chronicle', 'block', 'lib1-shelf1-book' || k || '-block' || p, 'delete', :round * 4,
       jsonb_build_object('event', 'deleted', 'by', 'author-' || (k % 17)), 'lib1'
  FROM generate_series(1, 10) k, generate_series(1, 3) p;

-- Bad on purpose: each ends failed with its reason, and holds up nothing.
-- books' mapping is strict and has no colour; blocks' position is an integer.
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key) VALUES
  ('books', 'book', 'bad-strict-' || :round, 'upsert', 1, '{"kind": "book", "title": "x", "colour": "red"}', 'lib2'),
  ('blocks', 'block', 'bad-type-' || :round, 'upsert', 1, '{"kind": "block", "position": "third"}', 'lib2'),
  ('blocks', 'block', 'bad-array-' || :round, 'upsert', 1, '["not", "an", "object"]', 'lib3');
-- Over the chronicle's payload limit (OUTBOX_CHRONICLE_MAX_PAYLOAD_BYTES).
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key) VALUES
  ('chronicle', 'block', 'bad-huge-' || :round, 'upsert', 1, jsonb_build_object('body', repeat('x', 300000)), 'lib3');
-- A projection this wlproj does not have: unknown_projection.
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key) VALUES
  ('wordcount', 'book', 'lib1-shelf1-book1', 'upsert', 1, '{"words": 1200}', 'lib1');
