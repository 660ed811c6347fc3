-- Every object of the extension, described with everything that defines it,
-- one line each (newlines written as \n) in a stable order: two databases whose outputs are equal have
-- the same extension.
SELECT pg_describe_object(d.classid, d.objid, 0) || ': ' ||
       coalesce(CASE
           WHEN d.classid = 'pg_proc'::regclass AND p.prokind = 'a' THEN
               concat_ws(' | ', pg_get_function_arguments(p.oid), a.aggtransfn::regproc, a.aggfinalfn::regproc,
                         a.aggfinalextra, a.aggtranstype::regtype, p.proparallel)
           WHEN d.classid = 'pg_proc'::regclass THEN replace(pg_get_functiondef(p.oid), E'\n', '\n')
           WHEN d.classid = 'pg_class'::regclass THEN
               (SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END
                                  || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), ''), ', ' ORDER BY attnum)
                FROM pg_attribute LEFT JOIN pg_attrdef ad ON ad.adrelid = attrelid AND ad.adnum = attnum
                WHERE attrelid = d.objid AND attnum > 0 AND NOT attisdropped)
               || ' | ' || coalesce((SELECT string_agg(pg_get_constraintdef(c.oid), ', ' ORDER BY conname)
                                     FROM pg_constraint c WHERE c.conrelid = d.objid), '')
               || ' | acl ' || coalesce((SELECT relacl::text FROM pg_class WHERE oid = d.objid), 'default')
               -- a view's query and options (security_invoker)
               || coalesce((SELECT ' | options ' || coalesce(c.reloptions::text, '-') || ' | '
                                   || replace(pg_get_viewdef(c.oid), E'\n', '\n')
                            FROM pg_class c WHERE c.oid = d.objid AND c.relkind = 'v'), '')
       END, '')
       || ' | acl ' || coalesce((SELECT proacl::text FROM pg_proc WHERE oid = d.objid AND d.classid = 'pg_proc'::regclass), '-')
       || ' | comment ' || coalesce(obj_description(d.objid, (SELECT relname FROM pg_class WHERE oid = d.classid)), '-')
FROM pg_depend d
LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
LEFT JOIN pg_aggregate a ON a.aggfnoid = p.oid
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_claim')
UNION ALL
-- the tables pg_dump keeps (pg_extension_config_dump), with their filters
SELECT 'dumped: ' || coalesce((SELECT string_agg(c::regclass::text || ' ' || coalesce(f, ''), ', ' ORDER BY c::regclass::text)
                                FROM unnest(e.extconfig, e.extcondition) AS x(c, f)), '-')
FROM pg_extension e WHERE e.extname = 'pg_claim'
ORDER BY 1;
