-- How far each process's audit journal is committed (journal.rs): the
-- transaction that writes journaled rows updates its mark, so a journal
-- replayed after a crash writes only the rows beyond it. Only SQLite
-- gateways keep journals; the table is here too so both schemas match.
CREATE TABLE audit_journal (
    name    TEXT PRIMARY KEY,
    applied BIGINT NOT NULL
);
