//! Who the caller is: a gateway token checked against the governance
//! snapshot, or a user whose access token the surface verified; every
//! attempt goes to the access audit.

use manifold_store::{AccessEvent, AuditRow, AuthError, RequestRows, now_ms, token_id_of};

use super::{
    Governance,
    caller::{Caller, UserGrant},
};

impl Governance {
    /// Checks a gateway bearer token and records the attempt in the access
    /// audit.
    ///
    /// A success's access row goes with the request's own activity or
    /// discovery row. A refusal's row is the request's only one, so it is
    /// recorded as `audit_commit` says.
    pub async fn authenticate(&self, bearer: &str) -> Result<Caller, AuthError> {
        Ok(self.authenticate_request(bearer).await?.0)
    }

    /// [`Governance::authenticate`] for a request the caller keeps serving:
    /// keep the returned [`RequestRows`] until the request is answered, so
    /// that its access row goes with the request's own row.
    pub async fn authenticate_request(
        &self,
        bearer: &str,
    ) -> Result<(Caller, RequestRows), AuthError> {
        let now = now_ms();
        let snapshot = self.snapshot();
        let outcome = match snapshot.bearer(bearer) {
            Some(known) => known.at(now),
            None => {
                let outcome = self.store.authenticate(bearer, now).await;
                snapshot.remember_bearer(bearer, &outcome);
                outcome
            }
        };
        match outcome {
            Ok(token) => {
                let caller = Caller::with_token(token);
                let event = AccessEvent::success(now, caller.name.clone(), caller.token_id());
                Ok((caller, self.begin_request(event).await))
            }
            Err(error) => {
                let event = AccessEvent::failure(now, token_id_of(bearer), error.reason());
                self.record_failure_row(AuditRow::Access(event)).await;
                Err(error)
            }
        }
    }

    /// Admits a caller whose identity-provider access token the surface has
    /// verified, and records it in the access audit like a gateway token.
    /// Keep the [`RequestRows`] as [`Governance::authenticate_request`] says.
    pub async fn admit_user(&self, grant: UserGrant) -> (Caller, RequestRows) {
        let caller = Caller::with_user(grant);
        let event = AccessEvent::success(now_ms(), caller.name.clone(), None);
        let rows = self.begin_request(event).await;
        (caller, rows)
    }

    /// Records an access token from the identity provider that was refused
    /// (`reason` says why; the token itself is never kept).
    pub async fn refuse_user_token(&self, reason: &str) {
        let event = AccessEvent::failure(now_ms(), None, format!("oauth: {reason}"));
        self.record_failure_row(AuditRow::Access(event)).await;
    }
}
