-- A per-principal sign-in is bound to the browser that started it: the
-- gateway's sign-in page keeps the authorization server's URL here, and the
-- SHA-256 of the cookie it set once the right principal signed in there. The
-- callback, on any replica, refuses a browser without that cookie.
ALTER TABLE oauth_pending ADD COLUMN authorize_url TEXT;
ALTER TABLE oauth_pending ADD COLUMN binding TEXT;
