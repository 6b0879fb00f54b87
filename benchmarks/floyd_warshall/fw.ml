(* Floyd-Warshall over a closed semiring given as a record of operations, with an
   optional next-hop matrix for path reconstruction. *)

type 'a semiring = {
  zero : 'a;             (* no path *)
  one : 'a;              (* empty path *)
  plus : 'a -> 'a -> 'a; (* choose *)
  times : 'a -> 'a -> 'a;(* extend *)
  better : 'a -> 'a -> bool;
}

let min_plus = {
  zero = max_int; one = 0;
  plus = (fun a b -> if a <= b then a else b);
  times = (fun a b -> if a = max_int || b = max_int then max_int else a + b);
  better = (fun a b -> a < b);
}

let max_min = {
  zero = 0; one = max_int;
  plus = (fun a b -> if a >= b then a else b);
  times = (fun a b -> if a <= b then a else b);
  better = (fun a b -> a > b);
}

let boolean = { zero = false; one = true; plus = ( || ); times = ( && ); better = (fun a b -> a && not b) }

type 'a result = { dist : 'a array array; next : int array array }

let run sr (g : Graph.t) (weight : int -> 'a) =
  let n = g.Graph.n in
  let dist = Array.init n (fun u -> Array.init n (fun v ->
      if u = v then sr.one else match Graph.edge g u v with Some w -> weight w | None -> sr.zero)) in
  let next = Array.init n (fun u -> Array.init n (fun v -> if u = v || Graph.edge g u v <> None then v else -1)) in
  for k = 0 to n - 1 do
    let dk = dist.(k) in
    for i = 0 to n - 1 do
      let di = dist.(i) and ni = next.(i) in
      let dik = di.(k) in
      if dik <> sr.zero then
        for j = 0 to n - 1 do
          let cand = sr.times dik dk.(j) in
          if sr.better cand di.(j) then begin
            di.(j) <- sr.plus cand di.(j);
            ni.(j) <- ni.(k)
          end
        done
    done
  done;
  { dist; next }

(* Path from u to v as a vertex list, by following next hops. *)
let path r u v =
  if r.next.(u).(v) < 0 then None
  else
    let rec go x acc = if x = v then Some (List.rev (v :: acc)) else go r.next.(x).(v) (x :: acc) in
    go u []
