//! The operator's rules (`engine::admin`), called as the CLI calls them but without the
//! binary: plan limits, signing-key rotation and retirement, the fleet's first key.

use std::time::Duration;

use agentid::domain::{OrgLimits, Plan};
use agentid::engine::admin::{self, AdminError, LimitChange};
use agentid::keys::{KeyRing, KeyState};
use agentid::store::{self, SharedStore, StoreOptions};

use crate::helpers::TestDb;

async fn open(db: &TestDb) -> SharedStore {
    store::connect(&db.url, &StoreOptions::default()).await.unwrap()
}

#[actix_web::test]
async fn set_limits_keeps_custom_limits_only_on_enterprise() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new(dir.path()).await;
    let store = open(&db).await;
    let keys = KeyRing::create(&dir.path().join("key.pem")).unwrap();
    let custom = OrgLimits::resolve(Plan::Enterprise, Some(7), Some(3), None).unwrap();
    let org = admin::create_org(&store, &keys, "acme", Plan::Enterprise, custom)
        .await
        .unwrap();

    // Naming one limit keeps the others on enterprise.
    let change = LimitChange {
        verify_limit: Some(9),
        ..LimitChange::default()
    };
    let after = admin::set_limits(&store, &keys, &org.org_id, change)
        .await
        .unwrap();
    assert_eq!(
        (after.limits().verify_per_minute, after.limits().other_per_minute),
        (9, 3)
    );

    // Another plan takes its table; custom values are refused there.
    let growth = LimitChange {
        plan: Some(Plan::Growth),
        ..LimitChange::default()
    };
    let after = admin::set_limits(&store, &keys, &org.org_id, growth)
        .await
        .unwrap();
    assert_eq!(Some(after.limits()), Plan::Growth.default_limits());
    let stored = store
        .get_org(&crate::helpers::org_id(&org.org_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.plan, Plan::Growth);
    let refused = admin::set_limits(&store, &keys, &org.org_id, change)
        .await
        .unwrap_err();
    assert!(matches!(refused, AdminError::Invalid(_)), "{refused}");

    let missing = admin::set_limits(&store, &keys, "org_nope", change)
        .await
        .unwrap_err();
    assert!(matches!(missing, AdminError::NoOrg(_)), "{missing}");
}

#[actix_web::test]
async fn rotation_and_retirement_follow_the_rules_without_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new(dir.path()).await;
    let store = open(&db).await;
    let path = dir.path().join("fleet.pem");
    let (root, created) = admin::fleet_signing_key(&store, &path).await.unwrap();
    assert!(created);
    // A second start with the same file takes the recorded key.
    let (again, created) = admin::fleet_signing_key(&store, &path).await.unwrap();
    assert!(!created);
    assert_eq!(again.kid(), root.kid());

    // The only active key cannot be retired.
    let refused = admin::retire_signing_key(&store, &root, root.kid())
        .await
        .unwrap_err();
    assert!(matches!(refused, AdminError::OnlyActiveKey(_)), "{refused}");

    // A key published for an hour is next; one at once signs, and then the first may go.
    let next = admin::rotate_signing_key(&store, &root, &path, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(next.state, KeyState::Next);
    let now = admin::rotate_signing_key(&store, &root, &path, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(now.state, KeyState::Active);
    admin::retire_signing_key(&store, &root, root.kid())
        .await
        .unwrap();
    let again = admin::retire_signing_key(&store, &root, root.kid())
        .await
        .unwrap_err();
    assert!(matches!(again, AdminError::RetiredAlready(_)), "{again}");
    let views = admin::signing_keys(&store, &root).await.unwrap();
    let state = |kid: &str| views.iter().find(|v| v.kid == kid).unwrap().state;
    assert_eq!(
        (state(root.kid()), state(&next.kid), state(&now.kid)),
        (KeyState::Retired, KeyState::Next, KeyState::Active)
    );
    let unknown = admin::retire_signing_key(&store, &root, "no-such-kid")
        .await
        .unwrap_err();
    assert!(matches!(unknown, AdminError::NoSigningKey(_)), "{unknown}");

    // Another key file seals nothing for this fleet.
    let stranger_path = dir.path().join("stranger.pem");
    let stranger = KeyRing::create(&stranger_path).unwrap();
    let refused = admin::rotate_signing_key(&store, &stranger, &stranger_path, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(refused, AdminError::NotFleetKeyFile { .. }), "{refused}");
    let refused = admin::fleet_signing_key(&store, &stranger_path)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(refused, AdminError::FleetKeyMismatch { .. }),
        "{refused}"
    );
}
