//! The operator's secrets: read once at start, put into a guest's request
//! headers by the host where `{secret:NAME}` stands and the job's grant
//! binds NAME to the request's host, and cut out of everything the job
//! leaves behind that the host writes (logs, captured output, error
//! messages). The guest never holds a value it did not receive back from
//! an upstream.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use http::HeaderValue;

use crate::job::grant::{HttpGrant, HttpScheme, SecretName};
use crate::sandbox::redact::Redactor;

/// The prefix of a variable that sets a secret: `LEASH_SECRET_GITHUB_TOKEN`
/// sets `GITHUB_TOKEN`.
pub const SECRET_ENV_PREFIX: &str = "LEASH_SECRET_";

/// Where a secret's value appears in a header value.
const OPEN: &str = "{secret:";

/// Secret values by name. `Debug` shows the names only.
#[derive(Clone, Default)]
pub struct SecretStore {
    values: BTreeMap<SecretName, String>,
}

impl fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretStore").field("names", &self.values.keys().collect::<Vec<_>>()).finish()
    }
}

impl SecretStore {
    /// Secrets from `(name, value)` pairs; a bad name or an empty value is
    /// refused by name (never by value).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Self, String> {
        let mut values = BTreeMap::new();
        for (name, value) in pairs {
            let name: SecretName = name.parse().map_err(|e| format!("{e}"))?;
            if value.is_empty() {
                return Err(format!("secret {name} is empty"));
            }
            if HeaderValue::from_str(&value).is_err() {
                return Err(format!("secret {name} cannot be sent in a header (control characters or non-ASCII)"));
            }
            values.insert(name, value);
        }
        Ok(SecretStore { values })
    }

    /// The `LEASH_SECRET_*` variables of this process, then the `NAME=value`
    /// lines of `file` (blank lines and `#` comments skipped; a file that
    /// others may read is refused). A name set in both takes the file's.
    pub fn load(env: impl IntoIterator<Item = (String, String)>, file: Option<&Path>) -> Result<Self, String> {
        let mut pairs: Vec<(String, String)> = env
            .into_iter()
            .filter_map(|(k, v)| k.strip_prefix(SECRET_ENV_PREFIX).map(|name| (name.to_owned(), v)))
            .collect();
        if let Some(file) = file {
            use std::os::unix::fs::PermissionsExt;
            let shown = file.display();
            let meta = std::fs::metadata(file).map_err(|e| format!("cannot read secrets file {shown}: {e}"))?;
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(format!(
                    "secrets file {shown} may be read by others (mode {:o}): chmod 600 it",
                    meta.permissions().mode() & 0o777
                ));
            }
            let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read secrets file {shown}: {e}"))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (name, value) = line
                    .split_once('=')
                    .ok_or_else(|| format!("secrets file {shown}, line {}: expected NAME=value", n + 1))?;
                pairs.push((name.trim().to_owned(), value.to_owned()));
            }
        }
        SecretStore::from_pairs(pairs)
    }

    /// The names set.
    pub fn names(&self) -> impl Iterator<Item = &SecretName> {
        self.values.keys()
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// What a job granted `grant` is cleaned of: each secret it names
    /// that is set, by its `{secret:NAME}` reference.
    pub(crate) fn redactor(&self, grant: &HttpGrant) -> Redactor {
        Redactor::new(
            grant
                .secrets
                .iter()
                .filter_map(|b| self.get(b.name.as_str()).map(|v| (v.to_owned(), format!("{OPEN}{}}}", b.name)))),
        )
    }

    /// What a text any job may have touched is cleaned of: every secret
    /// set, by its reference (a pool process's own stderr, which tells of
    /// all its jobs).
    pub(crate) fn redactor_every(&self) -> Redactor {
        Redactor::new(self.values.iter().map(|(name, v)| (v.clone(), format!("{OPEN}{name}}}"))))
    }
}

/// Put the secrets a header value names into it, where the grant binds
/// each to this request; an error names the secret and why (never its
/// value).
pub(super) fn substitute(
    headers: &mut http::HeaderMap,
    store: &SecretStore,
    grant: &HttpGrant,
    (method, scheme, host, port): (&str, HttpScheme, &str, u16),
) -> Result<Vec<SecretName>, String> {
    let mut carried: Vec<SecretName> = Vec::new();
    for value in headers.values_mut() {
        let Ok(text) = value.to_str() else { continue };
        if !text.contains(OPEN) {
            continue;
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at + OPEN.len()..];
            let end = after.find('}').ok_or("a {secret: reference has no closing }")?;
            let name = &after[..end];
            if !grant.secret_allowed(name, method, scheme, host, port) {
                return Err(format!("secret {name} is not granted for this request"));
            }
            let secret = store.get(name).ok_or_else(|| format!("secret {name} is not set on this host"))?;
            out.push_str(secret);
            if let Ok(name) = name.parse::<SecretName>()
                && !carried.contains(&name)
            {
                carried.push(name);
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        let mut substituted =
            HeaderValue::from_str(&out).map_err(|_| "a header with a secret is not a valid header value".to_owned())?;
        substituted.set_sensitive(true);
        *value = substituted;
    }
    Ok(carried)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(bindings: &[(&str, &str)]) -> HttpGrant {
        let mut grant = HttpGrant::default();
        for (name, rule) in bindings {
            grant.bind_secret(name.parse().unwrap(), rule.parse().unwrap());
        }
        grant
    }

    fn store() -> SecretStore {
        SecretStore::from_pairs([("TOKEN".into(), "t0ken".into()), ("OTHER".into(), "0ther".into())]).unwrap()
    }

    fn headers(value: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_str(value).unwrap());
        headers
    }

    const TO: (&str, HttpScheme, &str, u16) = ("GET", HttpScheme::Https, "api.example.com", 443);

    #[test]
    fn a_bound_secret_is_put_in_and_marked_sensitive() {
        let grant = grant(&[("TOKEN", "https://api.example.com"), ("OTHER", "https://api.example.com")]);
        let mut h = headers("Bearer {secret:TOKEN} and {secret:OTHER}{secret:TOKEN}");
        substitute(&mut h, &store(), &grant, TO).unwrap();
        assert_eq!(h["authorization"], "Bearer t0ken and 0thert0ken");
        assert!(h["authorization"].is_sensitive());
        let mut plain = headers("no secret here");
        substitute(&mut plain, &store(), &grant, TO).unwrap();
        assert_eq!(plain["authorization"], "no secret here");
    }

    #[test]
    fn an_unbound_unset_or_malformed_reference_refuses_the_request() {
        let elsewhere = grant(&[("TOKEN", "https://other.example.com")]);
        let err = substitute(&mut headers("{secret:TOKEN}"), &store(), &elsewhere, TO).unwrap_err();
        assert_eq!(err, "secret TOKEN is not granted for this request");
        let unset = grant(&[("MISSING", "https://api.example.com")]);
        let err = substitute(&mut headers("{secret:MISSING}"), &store(), &unset, TO).unwrap_err();
        assert_eq!(err, "secret MISSING is not set on this host");
        let err = substitute(&mut headers("{secret:TOKEN"), &store(), &elsewhere, TO).unwrap_err();
        assert!(err.contains("no closing"), "{err}");
    }

    #[test]
    fn bad_names_and_values_are_refused_without_the_value() {
        let err = SecretStore::from_pairs([("1X".into(), "v".into())]).unwrap_err();
        assert!(err.contains("1X") && !err.contains("\"v\""), "{err}");
        let err = SecretStore::from_pairs([("X".into(), "line\nbreak-s3cret".into())]).unwrap_err();
        assert!(err.contains("secret X") && !err.contains("s3cret"), "{err}");
        assert!(format!("{:?}", store()).contains("TOKEN") && !format!("{:?}", store()).contains("t0ken"));
    }

    #[test]
    fn a_secrets_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets");
        std::fs::write(&file, "# comment\n\nTOKEN=from-file\nOTHER = spaced=value\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = SecretStore::load([], Some(&file)).unwrap_err();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let env = [("LEASH_SECRET_TOKEN".to_owned(), "from-env".to_owned()), ("HOME".to_owned(), "/x".to_owned())];
        let store = SecretStore::load(env, Some(&file)).unwrap();
        assert_eq!((store.get("TOKEN"), store.get("OTHER")), (Some("from-file"), Some(" spaced=value")));
        assert_eq!(store.names().count(), 2, "only LEASH_SECRET_ variables count");
    }
}
