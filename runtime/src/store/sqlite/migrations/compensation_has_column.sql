-- Whether the compensation queue has a column (1) or not (0): a file made by an earlier release lacks
-- the columns added since.
-- $1 the column's name.
SELECT COUNT(*) FROM pragma_table_info('samekey_compensation') WHERE name = $1
