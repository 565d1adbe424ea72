//! A DNS server on loopback that the tests control: the zone is theirs to change between
//! calls. Messages are read and written by hickory-proto (the library the service's resolver
//! is built on); this file only moves them over UDP and TCP. A UDP answer that does not fit
//! 512 bytes (or the query's EDNS size) is sent truncated, and the resolver asks again over
//! TCP, as a real server makes it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, AAAA, TXT};
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Zone = HashMap<String, Vec<RData>>;

pub struct TestDns {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    tasks: Vec<actix_web::rt::task::JoinHandle<()>>,
}

impl Drop for TestDns {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A name as the zone keys it: lower case, no final dot.
fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl TestDns {
    /// Serves an empty zone on 127.0.0.1, UDP and TCP on one port.
    pub async fn start() -> TestDns {
        let (udp, tcp) = loop {
            let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let port = udp.local_addr().unwrap().port();
            if let Ok(tcp) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                break (udp, tcp);
            }
        };
        let addr = udp.local_addr().unwrap();
        let zone: Arc<Mutex<Zone>> = Arc::default();
        let udp_task = {
            let zone = zone.clone();
            actix_web::rt::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    let Ok((n, peer)) = udp.recv_from(&mut buf).await else {
                        continue;
                    };
                    let Some((answer, limit)) = respond(&zone, &buf[..n]) else {
                        continue;
                    };
                    let bytes = answer.to_vec().unwrap();
                    let bytes = if bytes.len() > limit {
                        answer.truncate().to_vec().unwrap()
                    } else {
                        bytes
                    };
                    let _ = udp.send_to(&bytes, peer).await;
                }
            })
        };
        let tcp_task = {
            let zone = zone.clone();
            actix_web::rt::spawn(async move {
                loop {
                    let Ok((mut conn, _)) = tcp.accept().await else {
                        continue;
                    };
                    let zone = zone.clone();
                    actix_web::rt::spawn(async move {
                        loop {
                            let Ok(len) = conn.read_u16().await else { return };
                            let mut q = vec![0u8; usize::from(len)];
                            if conn.read_exact(&mut q).await.is_err() {
                                return;
                            }
                            let Some((answer, _)) = respond(&zone, &q) else {
                                return;
                            };
                            let bytes = answer.to_vec().unwrap();
                            let Ok(len) = u16::try_from(bytes.len()) else {
                                return;
                            };
                            if conn.write_u16(len).await.is_err() || conn.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            })
        };
        TestDns {
            addr,
            zone,
            tasks: vec![udp_task, tcp_task],
        }
    }

    fn set(&self, name: &str, records: Vec<RData>) {
        let mut zone = self.zone.lock().unwrap();
        let k = key(name);
        let mut kept: Vec<RData> = zone
            .remove(&k)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !records.iter().any(|n| n.record_type() == r.record_type()))
            .collect();
        kept.extend(records);
        zone.insert(k, kept);
    }

    /// The TXT records of `name`, one string each (replacing its TXT records).
    pub fn txt(&self, name: &str, values: &[&str]) {
        let records = values
            .iter()
            .map(|v| RData::TXT(TXT::new(vec![(*v).to_owned()])))
            .collect();
        self.set(name, records);
    }

    /// One TXT record of `name` made of these character-strings (each at most 255 bytes).
    pub fn txt_strings(&self, name: &str, strings: Vec<Vec<u8>>) {
        let refs: Vec<&[u8]> = strings.iter().map(Vec::as_slice).collect();
        self.set(name, vec![RData::TXT(TXT::from_bytes(refs))]);
    }

    /// The address of `name` (replacing its A or AAAA records).
    pub fn addr(&self, name: &str, ip: IpAddr) {
        let rdata = match ip {
            IpAddr::V4(v4) => RData::A(A(v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        self.set(name, vec![rdata]);
    }
}

/// The answer to a query, and the size a UDP answer may have; `None` for what is no query.
fn respond(zone: &Mutex<Zone>, bytes: &[u8]) -> Option<(Message, usize)> {
    let query = Message::from_vec(bytes).ok()?;
    if query.metadata.message_type != MessageType::Query {
        return None;
    }
    let q = query.queries.first()?.clone();
    let name = key(&q.name().to_ascii());
    let mut answer = Message::response(query.metadata.id, query.metadata.op_code);
    answer.metadata.authoritative = true;
    answer.metadata.recursion_desired = query.metadata.recursion_desired;
    answer.metadata.recursion_available = true;
    answer.add_query(q.clone());
    let limit = query
        .edns
        .as_ref()
        .map_or(512, |e| usize::from(e.max_payload()).max(512));
    if let Some(edns) = query.edns.clone() {
        answer.set_edns(edns);
    }
    let zone = zone.lock().unwrap();
    match zone.get(&name) {
        None => answer.metadata.response_code = ResponseCode::NXDomain,
        Some(records) => {
            for r in records
                .iter()
                .filter(|r| r.record_type() == q.query_type() || q.query_type() == RecordType::ANY)
            {
                answer.add_answer(Record::from_rdata(q.name().clone(), 0, r.clone()));
            }
        }
    }
    Some((answer, limit))
}
