-- Set-up shared by the regression tests, which run in name order in one
-- database, this file first: the extension, and pc_try(stmt), which runs a
-- statement and shows its SQLSTATE, message and hint instead of failing
-- (runs of 15 or more digits, such as fencing tokens, shown as T).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_claim;
RESET client_min_messages;

CREATE FUNCTION pc_try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE state text; msg text; hint text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS OR query_canceled THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    RETURN state || ': ' || regexp_replace(msg, '\d{15,}', 'T', 'g')
        || coalesce(E'\n  hint: ' || nullif(hint, ''), '');
END $$;
