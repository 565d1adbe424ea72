-- Nothing here: one instance keeps its rate-limit buckets in memory. The fleet's shared
-- buckets are PostgreSQL's migration of the same number.
SELECT 1;
