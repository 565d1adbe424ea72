//! The receiver's protected resource metadata (RFC 9728) as a tower service.

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::ResourceMetadata;

/// A tower service answering every request with a receiver's protected resource
/// metadata (RFC 9728): mount it at [`ResourceMetadata::path`]
/// (`Router::new().route_service(metadata.path(), ResourceMetadataService::<Body>::new(&metadata))`
/// in axum), its answers' body of type `R`.
pub struct ResourceMetadataService<R> {
    body: Arc<str>,
    answers: std::marker::PhantomData<fn() -> R>,
}

impl<R> Clone for ResourceMetadataService<R> {
    fn clone(&self) -> Self {
        ResourceMetadataService {
            body: self.body.clone(),
            answers: std::marker::PhantomData,
        }
    }
}

impl<R> ResourceMetadataService<R> {
    pub fn new(metadata: &ResourceMetadata) -> Self {
        ResourceMetadataService {
            body: metadata.document().to_string().into(),
            answers: std::marker::PhantomData,
        }
    }
}

impl<B, R: From<String>> tower_service::Service<http::Request<B>> for ResourceMetadataService<R> {
    type Response = http::Response<R>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<B>) -> Self::Future {
        std::future::ready(Ok(http::Response::builder()
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::CACHE_CONTROL, "public, max-age=3600")
            .header(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")
            .body(R::from(self.body.to_string()))
            .expect("a valid response")))
    }
}
