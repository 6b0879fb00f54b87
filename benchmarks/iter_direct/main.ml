(* Iterator pipelines: map/filter/zip/flat_map/scan/take_while folded to checksums. *)
open Iter

let m = 1_000_003
let ( |> ) x f = f x

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10000 in
  let squares = range 1 n |> map (fun x -> x * x mod m) in
  let evens = squares |> filter (fun x -> x land 1 = 0) in
  let c1 = zip evens (range 1 n |> map (fun x -> (x * 7) + 3)) |> map (fun (a, b) -> a lxor b) |> fold (fun acc x -> (acc + x) mod m) 0 in
  let c2 = range 1 (n / 4) |> flat_map (fun x -> range 0 (x mod 7) |> map (fun k -> x * k)) |> fold (fun acc x -> ((acc * 31) + x) mod m) 1 in
  let c3 = range 1 n |> scan ( + ) 0 |> take_while (fun s -> s < n * 50) |> length in
  let c4 = range 1 n |> map (fun x -> x mod 97) |> pairs |> filter (fun (a, b) -> a < b) |> take (n / 3) |> fold (fun acc (a, b) -> acc + (a * b)) 0 in
  let c5 =
    range 1 (n / 2)
    |> map (fun x -> (x, x * x))
    |> filter (fun (x, _) -> x mod 3 <> 0)
    |> map (fun (x, y) -> (y - x) mod 1009)
    |> zip (range 1 n |> filter (fun x -> x mod 5 = 0))
    |> fold (fun acc (a, b) -> (acc + (a * b)) mod m) 0
  in
  Printf.printf "n %d\n" n;
  Printf.printf "checksums %d %d %d %d %d\n" c1 c2 c3 c4 c5
