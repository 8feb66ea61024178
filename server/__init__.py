"""The tuning service: settings, the SQL schema and the records database (`SQLDatabase`). Imports `compiler/`;
`compiler/` never imports it."""
