(* List utilities written on top of folds and small higher-order helpers. *)

let range a b = List.init (max 0 (b - a + 1)) (fun i -> a + i)

let rec take n = function [] -> [] | x :: xs -> if n <= 0 then [] else x :: take (n - 1) xs
let rec drop n = function [] -> [] | _ :: xs as l -> if n <= 0 then l else drop (n - 1) xs

(* run-length encoding *)
let encode l =
  List.fold_right
    (fun x acc -> match acc with (y, k) :: rest when y = x -> (y, k + 1) :: rest | _ -> (x, 1) :: acc)
    l []

let decode l = List.concat_map (fun (x, k) -> List.init k (fun _ -> x)) l

let group_by key l =
  let tbl = List.fold_left (fun acc x ->
      let k = key x in
      match List.assoc_opt k acc with
      | Some xs -> (k, x :: xs) :: List.remove_assoc k acc
      | None -> (k, [ x ]) :: acc) [] l in
  List.sort (fun (a, _) (b, _) -> compare a b) (List.map (fun (k, xs) -> (k, List.rev xs)) tbl)

let rec interleave x = function [] -> [ [ x ] ] | y :: ys as l -> (x :: l) :: List.map (fun r -> y :: r) (interleave x ys)
let rec permutations = function [] -> [ [] ] | x :: xs -> List.concat_map (interleave x) (permutations xs)

let rec merge cmp a b =
  match (a, b) with
  | [], l | l, [] -> l
  | x :: xs, y :: ys -> if cmp x y <= 0 then x :: merge cmp xs b else y :: merge cmp a ys

let windows k l =
  let rec go acc l = if List.compare_length_with l k < 0 then List.rev acc else go (take k l :: acc) (List.tl l) in
  go [] l

let sum = List.fold_left ( + ) 0
let hash_list l = List.fold_left (fun h x -> ((h * 31) + x) land 0x3fffffff) 17 l
